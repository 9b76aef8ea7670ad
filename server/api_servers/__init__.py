"""Several API server processes over one engine (`ahc serve --api-server-count N`) and what they share."""
