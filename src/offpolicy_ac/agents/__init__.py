"""Stateless agents: IMPALA, ACER, SQL, SQIL (init / act / greedy_act / update)."""

from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.base import AgentState
from offpolicy_ac.agents.impala import ImpalaConfig
from offpolicy_ac.agents.impala import make_impala

__all__ = ["Agent", "AgentState", "ImpalaConfig", "make_impala"]
from offpolicy_ac.agents.sql import SqlConfig  # noqa: E402
from offpolicy_ac.agents.sql import make_sql  # noqa: E402

__all__ += ["SqlConfig", "make_sql"]
from offpolicy_ac.agents.sqil import SqilConfig  # noqa: E402
from offpolicy_ac.agents.sqil import make_sqil  # noqa: E402
from offpolicy_ac.agents.sqil import make_sqil_batch_fn  # noqa: E402

__all__ += ["SqilConfig", "make_sqil", "make_sqil_batch_fn"]

from offpolicy_ac.agents.acer import AcerConfig  # noqa: E402
from offpolicy_ac.agents.acer import make_acer  # noqa: E402
from offpolicy_ac.agents.acer import make_acer_continuous  # noqa: E402
from offpolicy_ac.agents.acer import make_acer_discrete  # noqa: E402

__all__ += ["AcerConfig", "make_acer", "make_acer_continuous", "make_acer_discrete"]
