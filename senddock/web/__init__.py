"""`senddock serve`: the HTTP side (one-click unsubscribe, SES notifications over SNS) and the
bounds it holds every request and every outbound fetch to."""
