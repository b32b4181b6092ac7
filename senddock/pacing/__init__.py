"""Pacing: the rates senddock may send at, and which of them a send is subject to.

Pure values, read from the config's ``pacing`` section. The limiter that holds them for the whole
cluster lives in Postgres; its statement is ``pacing_take`` and its access is ``senddock.core.pacer``.
"""
