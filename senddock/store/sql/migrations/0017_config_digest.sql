-- senddock schema, version 17: each node records the digest of the config it runs with.
--
-- A node reads its config once, at start: a file edited since is not what it runs. `senddock
-- nodes` shows each node's digest and whether it equals the digest of the file the command was
-- given. The sha256 of the effective config with its secrets masked (senddock.config_digest), in
-- hex. NULL: a node of an earlier senddock, which recorded none.
ALTER TABLE nodes ADD COLUMN config_digest text;
