"""Domain service functions: the HTTP layer validates, these act on the database."""
