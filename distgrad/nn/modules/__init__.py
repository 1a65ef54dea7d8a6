"""The layers of ``distgrad.nn``, as ``torch.nn.modules``."""
from .module import Module
from .linear import Identity, Linear
from .activation import GELU, LeakyReLU, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh
from .activation import MultiheadAttention
from .flatten import Flatten, Unflatten
from .distance import CosineSimilarity, PairwiseDistance
from .sparse import EmbeddingBag
from .loss import BCELoss, BCEWithLogitsLoss, HuberLoss, KLDivLoss, SmoothL1Loss
from .transformer import (Transformer, TransformerDecoder, TransformerDecoderLayer,
                          TransformerEncoder, TransformerEncoderLayer)
from .container import ModuleDict, ModuleList, Sequential
from .dropout import Dropout
from .normalization import LayerNorm
from .sparse import Embedding
from .loss import CrossEntropyLoss, L1Loss, MSELoss, NLLLoss

__all__ = ["Module", "Identity", "Linear", "GELU", "LeakyReLU", "LogSoftmax", "ReLU", "Sigmoid",
           "Softmax", "Tanh", "ModuleDict", "ModuleList", "Sequential", "Dropout", "LayerNorm",
           "Embedding", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss"]
__all__ += ["MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
            "TransformerEncoderLayer", "TransformerDecoderLayer", "Flatten", "Unflatten",
            "CosineSimilarity", "PairwiseDistance", "EmbeddingBag", "BCELoss", "BCEWithLogitsLoss",
            "HuberLoss", "KLDivLoss", "SmoothL1Loss"]
