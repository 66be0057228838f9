"""Lethe: certified machine unlearning as a service. The HTTP layer (`app/api`) and the
torch-free domain it and the workers share: services, the ledger, storage, privacy."""
