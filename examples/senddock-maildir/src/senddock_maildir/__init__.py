"""Example senddock plugins: a Maildir transport and a steady retry backoff."""
