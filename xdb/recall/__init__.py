"""Reading the experience: recall's filters and queries, the experience browser's reads, insights (README.md)."""
