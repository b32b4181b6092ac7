-- senddock schema, version 15: adaptive pacing learns the rate a provider allows.
--
-- A throttled limit used to climb back by a tenth of its configured rate every 10 s whatever it
-- had been throttled at: a group configured at 100/s whose provider allows 5/s climbed from 3/s
-- to 5/s in two seconds and was throttled again, half its sends refused. ceiling is the factor in
-- force when the limit was last halved (NULL: never: 1), and the factor climbs back by a share of
-- it, not of the configured rate: from half the ceiling back to it in half the recovery time.
ALTER TABLE pacing_limits ADD COLUMN ceiling float8 CHECK (ceiling > 0 AND ceiling <= 1);
