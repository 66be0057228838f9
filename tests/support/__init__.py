"""What the tests and the benches share: servers of their own (PostgreSQL databases, Redis,
SeaweedFS, a Lethe cluster), factories and receivers. It imports no test and no bench."""
