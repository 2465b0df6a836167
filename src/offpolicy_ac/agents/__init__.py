"""Stateless agents: IMPALA, ACER, SQL, SQIL (init / act / greedy_act / update)."""

from offpolicy_ac.agents.acer import AcerConfig
from offpolicy_ac.agents.acer import make_acer
from offpolicy_ac.agents.acer import make_acer_continuous
from offpolicy_ac.agents.acer import make_acer_discrete
from offpolicy_ac.agents.base import Agent
from offpolicy_ac.agents.base import AgentState
from offpolicy_ac.agents.base import BatchFn
from offpolicy_ac.agents.hyperparams import check_setting
from offpolicy_ac.agents.hyperparams import hyperparams_of
from offpolicy_ac.agents.hyperparams import parse_sweep
from offpolicy_ac.agents.hyperparams import sweep_settings
from offpolicy_ac.agents.hyperparams import tunable_fields
from offpolicy_ac.agents.hyperparams import with_hyperparams
from offpolicy_ac.agents.impala import ImpalaConfig
from offpolicy_ac.agents.impala import make_impala
from offpolicy_ac.agents.registry import register_agent
from offpolicy_ac.agents.sqil import SqilConfig
from offpolicy_ac.agents.sqil import make_sqil
from offpolicy_ac.agents.sqil import make_sqil_batch_fn
from offpolicy_ac.agents.sql import SqlConfig
from offpolicy_ac.agents.sql import make_sql
from offpolicy_ac.agents.sql import make_sql_discrete
from offpolicy_ac.agents.sql_continuous import make_sql_continuous

__all__ = [
    "AcerConfig",
    "Agent",
    "AgentState",
    "BatchFn",
    "ImpalaConfig",
    "SqilConfig",
    "SqlConfig",
    "check_setting",
    "hyperparams_of",
    "make_acer",
    "make_acer_continuous",
    "make_acer_discrete",
    "make_impala",
    "make_sqil",
    "make_sqil_batch_fn",
    "make_sql",
    "make_sql_continuous",
    "make_sql_discrete",
    "parse_sweep",
    "register_agent",
    "sweep_settings",
    "tunable_fields",
    "with_hyperparams",
]
