"""Flax networks: torsos (MLP, Nature-CNN, IMPALA-ResNet, a small CNN, the MinAtar
network), agent heads, and actor-critics with a shared torso or one torso each
(`actor_critic`)."""

from offpolicy_ac.networks.heads import ActorQCritic
from offpolicy_ac.networks.heads import AmortizedSampler
from offpolicy_ac.networks.heads import CategoricalActorCritic
from offpolicy_ac.networks.heads import GaussianActorCritic
from offpolicy_ac.networks.heads import QNetwork
from offpolicy_ac.networks.heads import StateActionQNetwork
from offpolicy_ac.networks.heads import StochasticDuelingNetwork
from offpolicy_ac.networks.split import SplitTorsos
from offpolicy_ac.networks.split import actor_critic
from offpolicy_ac.networks.torsos import TORSOS
from offpolicy_ac.networks.torsos import ImpalaResNet
from offpolicy_ac.networks.torsos import MinAtarCNN
from offpolicy_ac.networks.torsos import MLPTorso
from offpolicy_ac.networks.torsos import NatureCNN
from offpolicy_ac.networks.torsos import SmallCNN
from offpolicy_ac.networks.torsos import make_torso
from offpolicy_ac.networks.torsos import register_torso
from offpolicy_ac.networks.torsos import torso_kind

__all__ = [
    "ActorQCritic",
    "AmortizedSampler",
    "CategoricalActorCritic",
    "GaussianActorCritic",
    "ImpalaResNet",
    "MLPTorso",
    "MinAtarCNN",
    "NatureCNN",
    "QNetwork",
    "SmallCNN",
    "SplitTorsos",
    "StateActionQNetwork",
    "StochasticDuelingNetwork",
    "TORSOS",
    "actor_critic",
    "make_torso",
    "register_torso",
    "torso_kind",
]
