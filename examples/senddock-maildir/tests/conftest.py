# senddock's pytest helpers: a real Postgres (SENDDOCK_TEST_DSN, or an embedded one), a fresh
# database per test, config files, an in-process broadcast runner, an SMTP sink.
pytest_plugins = ["senddock.testing"]
