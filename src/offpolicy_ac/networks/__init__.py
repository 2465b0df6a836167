"""Flax networks: torsos (MLP, Nature-CNN, IMPALA-ResNet) and agent heads."""

from offpolicy_ac.networks.heads import ActorQCritic
from offpolicy_ac.networks.heads import AmortizedSampler
from offpolicy_ac.networks.heads import CategoricalActorCritic
from offpolicy_ac.networks.heads import GaussianActorCritic
from offpolicy_ac.networks.heads import QNetwork
from offpolicy_ac.networks.heads import StateActionQNetwork
from offpolicy_ac.networks.heads import StochasticDuelingNetwork
from offpolicy_ac.networks.torsos import TORSOS
from offpolicy_ac.networks.torsos import ImpalaResNet
from offpolicy_ac.networks.torsos import MLPTorso
from offpolicy_ac.networks.torsos import NatureCNN
from offpolicy_ac.networks.torsos import make_torso

__all__ = [
    "ActorQCritic",
    "AmortizedSampler",
    "CategoricalActorCritic",
    "GaussianActorCritic",
    "ImpalaResNet",
    "MLPTorso",
    "NatureCNN",
    "QNetwork",
    "StateActionQNetwork",
    "StochasticDuelingNetwork",
    "TORSOS",
    "make_torso",
]
