"""Pure target and loss functions: V-trace, Retrace/ACER, soft-Q/SQL/SQIL, SVGD.

Every target and loss takes time-major arrays with a leading time axis T and
any number of trailing batch axes (`[T]`, `[T, B]`, ...); the per-state helpers
(soft value and policy, SVGD, the trust-region projection) take `[..., A]` or
particle-major arrays, as each documents. All are jittable and vmappable and
validate shapes, dtypes and hyper-parameters at trace time.
This package imports nothing else from `offpolicy_ac`.
"""

from offpolicy_ac.losses._acer import AcerContinuousTargets
from offpolicy_ac.losses._acer import TrustRegionOutput
from offpolicy_ac.losses._acer import acer_continuous_policy_objective
from offpolicy_ac.losses._acer import acer_continuous_targets
from offpolicy_ac.losses._acer import acer_continuous_value_losses
from offpolicy_ac.losses._acer import acer_policy_loss
from offpolicy_ac.losses._acer import acer_policy_objective
from offpolicy_ac.losses._acer import acer_q_ret
from offpolicy_ac.losses._acer import acer_trust_region_policy_loss
from offpolicy_ac.losses._acer import acer_value_loss
from offpolicy_ac.losses._acer import sdn_q_value
from offpolicy_ac.losses._acer import trust_region_projection
from offpolicy_ac.losses._acer import trust_region_surrogate
from offpolicy_ac.losses._actions import take_action
from offpolicy_ac.losses._checks import without_range_checks
from offpolicy_ac.losses._distributions import ImportanceRatios
from offpolicy_ac.losses._distributions import categorical_entropy
from offpolicy_ac.losses._distributions import categorical_importance_ratios
from offpolicy_ac.losses._distributions import categorical_kl
from offpolicy_ac.losses._distributions import categorical_log_prob
from offpolicy_ac.losses._distributions import exceeds_threshold
from offpolicy_ac.losses._distributions import gaussian_entropy
from offpolicy_ac.losses._distributions import gaussian_kl
from offpolicy_ac.losses._distributions import gaussian_log_prob
from offpolicy_ac.losses._distributions import importance_ratios_from_log_probs
from offpolicy_ac.losses._impala import ImpalaLossOutput
from offpolicy_ac.losses._impala import check_surrogate_clip
from offpolicy_ac.losses._impala import clipped_surrogate
from offpolicy_ac.losses._impala import impala_loss
from offpolicy_ac.losses._impala import impala_loss_categorical
from offpolicy_ac.losses._impala import impala_loss_gaussian
from offpolicy_ac.losses._impala import step_weights
from offpolicy_ac.losses._impala import weighted_mean
from offpolicy_ac.losses._recurrence import reverse_linear_recurrence
from offpolicy_ac.losses._retrace import general_off_policy_returns
from offpolicy_ac.losses._retrace import retrace
from offpolicy_ac.losses._retrace import retrace_targets
from offpolicy_ac.losses._soft_q import soft_nstep_targets
from offpolicy_ac.losses._soft_q import soft_policy
from offpolicy_ac.losses._soft_q import soft_q_targets
from offpolicy_ac.losses._soft_q import soft_value
from offpolicy_ac.losses._soft_q import sqil_relabel
from offpolicy_ac.losses._soft_q import sqil_rewards
from offpolicy_ac.losses._soft_q import sql_nstep_td_error
from offpolicy_ac.losses._svgd import RbfKernelOutput
from offpolicy_ac.losses._svgd import box_mixture_log_density
from offpolicy_ac.losses._svgd import importance_sampled_soft_value
from offpolicy_ac.losses._svgd import rbf_kernel
from offpolicy_ac.losses._svgd import sample_box_mixture
from offpolicy_ac.losses._svgd import svgd_direction
from offpolicy_ac.losses._vtrace import VTraceOutput
from offpolicy_ac.losses._vtrace import vtrace

__all__ = [
    "AcerContinuousTargets",
    "ImpalaLossOutput",
    "ImportanceRatios",
    "RbfKernelOutput",
    "TrustRegionOutput",
    "VTraceOutput",
    "acer_continuous_policy_objective",
    "acer_continuous_targets",
    "acer_continuous_value_losses",
    "acer_policy_loss",
    "acer_policy_objective",
    "acer_q_ret",
    "acer_trust_region_policy_loss",
    "acer_value_loss",
    "box_mixture_log_density",
    "categorical_entropy",
    "categorical_importance_ratios",
    "categorical_kl",
    "categorical_log_prob",
    "check_surrogate_clip",
    "clipped_surrogate",
    "exceeds_threshold",
    "gaussian_entropy",
    "gaussian_kl",
    "gaussian_log_prob",
    "general_off_policy_returns",
    "impala_loss",
    "impala_loss_categorical",
    "impala_loss_gaussian",
    "importance_ratios_from_log_probs",
    "importance_sampled_soft_value",
    "rbf_kernel",
    "retrace",
    "retrace_targets",
    "reverse_linear_recurrence",
    "sample_box_mixture",
    "sdn_q_value",
    "soft_nstep_targets",
    "soft_policy",
    "soft_q_targets",
    "soft_value",
    "sql_nstep_td_error",
    "sqil_relabel",
    "sqil_rewards",
    "step_weights",
    "svgd_direction",
    "take_action",
    "trust_region_projection",
    "trust_region_surrogate",
    "vtrace",
    "weighted_mean",
    "without_range_checks",
]
