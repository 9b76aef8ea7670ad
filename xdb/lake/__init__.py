"""The shared experience lake (`xdb.backend: ducklake`): its tables, shipper, purges, cluster-wide reads (README.md)."""
