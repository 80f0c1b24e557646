"""Administration: admin accounts and sessions, the JSON admin API, the audit log."""
