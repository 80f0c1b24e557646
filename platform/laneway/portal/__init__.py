"""The customer portal (/portal): a tenant's own users see and manage that tenant only."""
