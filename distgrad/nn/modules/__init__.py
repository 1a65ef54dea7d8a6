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
from .dropout import Dropout, Dropout1d, Dropout2d
from .normalization import LayerNorm
from .sparse import Embedding
from .loss import CrossEntropyLoss, L1Loss, MSELoss, NLLLoss
from .conv import Conv1d, Conv2d
from .conv_transpose import ConvTranspose1d, ConvTranspose2d
from .pooling import (AdaptiveAvgPool1d, AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, MaxPool1d,
                      MaxPool2d)
from .batchnorm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from .rnn import GRU, GRUCell, LSTM, LSTMCell, RNN, RNNBase, RNNCell, RNNCellBase
from . import module_codec  # noqa: F401 - modules travel through the value codec

__all__ = ["Module", "Identity", "Linear", "GELU", "LeakyReLU", "LogSoftmax", "ReLU", "Sigmoid",
           "Softmax", "Tanh", "ModuleDict", "ModuleList", "Sequential", "Dropout", "LayerNorm",
           "Embedding", "CrossEntropyLoss", "L1Loss", "MSELoss", "NLLLoss"]
__all__ += ["MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
            "TransformerEncoderLayer", "TransformerDecoderLayer", "Flatten", "Unflatten",
            "CosineSimilarity", "PairwiseDistance", "EmbeddingBag", "BCELoss", "BCEWithLogitsLoss",
            "HuberLoss", "KLDivLoss", "SmoothL1Loss"]
__all__ += ["Dropout1d", "Dropout2d", "Conv1d", "Conv2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d",
            "AvgPool1d", "AvgPool2d", "MaxPool1d", "MaxPool2d", "BatchNorm1d", "BatchNorm2d",
            "BatchNorm3d", "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell",
            "GRUCell"]
__all__ += ["ConvTranspose1d", "ConvTranspose2d"]
