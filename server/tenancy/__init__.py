"""Who is calling and what it may reach: keys as tenants, the request's context, XDB as one tenant sees it."""
