"""The configuration as data: its schema, the environment's values, the typed sections and the
checks across them. Loading a file with its plugins is :func:`senddock.loading.load_config`: this
package imports no feature (each section's owner registers its checks in :mod:`.checks`).

| module | its one job |
|---|---|
| ``file`` | reading the YAML file; the folder relative paths resolve against |
| ``schema`` | schema.json and the ``duration``/``size`` keywords |
| ``environment`` | ``${NAME}`` substitution; secrets never written in the file |
| ``validation`` | validate as written, substitute, validate again, fill defaults, run the checks |
| ``checks`` | the checks JSON Schema cannot say, and the register owners add theirs to |
| ``sections`` | :class:`Config` and the typed settings of its sections |
| ``mail`` | the sections that shape a message, typed: ``unsubscribe``, ``dkim``, ``templates`` |
| ``bounces`` | the ``bounces`` section, typed: VERP keys, soft bounces, the receiver and the mailbox |
| ``serve`` | the ``serve`` section, typed: limits, SNS, /metrics and the dashboard's account |
| ``webhooks`` | the ``webhooks`` section, typed: endpoints and subscriptions |
"""

from senddock.config.bounces import (BounceMailboxSettings, BounceReceiveSettings, BouncesSettings,
                                     SoftBounceSettings)
from senddock.config.environment import ENV_CONFIG, ENV_DATABASE_URL, secret_env_name
from senddock.config.mail import DkimSettings, TemplateSettings, UnsubscribeSettings
from senddock.config.schema import base_schema
from senddock.config.sections import (DEFAULT_CONCURRENCY, BreakerSettings, Config, DatabaseSettings, LoggingSettings,
                                      MetricsSettings, RecoverySettings, find_config_path, transport_name)
from senddock.config.serve import AdminSettings, ServeMetricsSettings, ServeSettings

__all__ = ["DEFAULT_CONCURRENCY", "ENV_CONFIG", "ENV_DATABASE_URL", "AdminSettings", "BounceMailboxSettings",
           "BounceReceiveSettings", "BouncesSettings", "BreakerSettings", "Config", "DatabaseSettings", "DkimSettings",
           "LoggingSettings", "MetricsSettings", "RecoverySettings", "ServeMetricsSettings", "ServeSettings",
           "SoftBounceSettings", "TemplateSettings", "UnsubscribeSettings", "base_schema", "find_config_path",
           "secret_env_name", "transport_name"]
