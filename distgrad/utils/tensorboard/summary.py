"""TensorBoard ``Summary`` protos of the values ``SummaryWriter`` logs: scalars,
histograms, text and the hparams plugin's three records. TensorBoard's own helpers for
these need TensorFlow; these need only the ``tensorboard`` package and NumPy."""
import numpy as np
from google.protobuf import struct_pb2
from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.plugins.hparams import api_pb2, metadata as hp_metadata, plugin_data_pb2
from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

from distgrad.autograd.tensor import Tensor

__all__ = ["make_np", "scalar", "histogram", "histogram_raw", "text", "hparams"]


def make_np(x):
    """``x`` (a tensor, array, number or list) as a NumPy array."""
    if isinstance(x, Tensor):
        return x.detach().numpy()
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (int, float, np.generic, list, tuple)):
        return np.asarray(x)
    raise NotImplementedError(f"got {type(x).__name__}, but numpy array, distgrad tensor, or "
                              "number are expected")


def _one(value, what):
    a = make_np(value)
    if a.size != 1:
        raise ValueError(f"{what}: expected a single value, got an array of shape {a.shape}")
    return a.reshape(())


def scalar(tag, value, new_style=False, double_precision=False):
    v = _one(value, "scalar")
    if not new_style:
        return Summary(value=[Summary.Value(tag=tag, simple_value=float(v))])
    # the scalars plugin's tensor form
    tensor = TensorProto(dtype="DT_DOUBLE", double_val=[float(v)]) if double_precision \
        else TensorProto(dtype="DT_FLOAT", float_val=[float(v)])
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"))
    return Summary(value=[Summary.Value(tag=tag, tensor=tensor, metadata=meta)])


def _tensorflow_edges():
    """TensorFlow's default histogram bucket edges: +-1e-12 * 1.1**k up to 1e20, and 0."""
    pos = [1e-12]
    while pos[-1] < 1e20:
        pos.append(pos[-1] * 1.1)
    return np.array([-x for x in reversed(pos)] + [0.0] + pos)


def histogram_raw(tag, min, max, num, sum, sum_squares, bucket_limits, bucket_counts):  # noqa: A002
    proto = HistogramProto(min=min, max=max, num=num, sum=sum, sum_squares=sum_squares,
                           bucket_limit=bucket_limits, bucket=bucket_counts)
    return Summary(value=[Summary.Value(tag=tag, histo=proto)])


def histogram(tag, values, bins, max_bins=None):
    a = make_np(values).astype(np.float64).reshape(-1)
    if a.size == 0:
        raise ValueError("The histogram is empty, please file a bug report.")
    edges = _tensorflow_edges() if isinstance(bins, str) and bins == "tensorflow" else bins
    counts, limits = np.histogram(a, bins=edges)
    if max_bins is not None and len(counts) > max_bins:
        # merge neighbouring buckets until there are at most max_bins
        step = -(-len(counts) // max_bins)
        pad = (-len(counts)) % step
        counts = np.pad(counts, (0, pad)).reshape(-1, step).sum(axis=1)
        limits = np.concatenate([limits[:-1:step], limits[-1:]])
    nonzero = np.nonzero(counts)[0]
    # drop the empty buckets at both ends (one stays below the lowest value: the lower
    # edge of the first full bucket)
    lo, hi = max(nonzero[0] - 1, 0), nonzero[-1] + 1
    counts, right = counts[lo:hi], limits[lo + 1:hi + 1]
    return histogram_raw(tag, float(a.min()), float(a.max()), float(a.size), float(a.sum()),
                         float(np.dot(a, a)), right.tolist(), counts.astype(float).tolist())


def text(tag, text_string):
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name="text", content=TextPluginData(version=0).SerializeToString()))
    tensor = TensorProto(dtype="DT_STRING", string_val=[text_string.encode("utf-8")],
                         tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
    return Summary(value=[Summary.Value(tag=tag + "/text_summary", metadata=meta,
                                        tensor=tensor)])


def _hp_summary(tag, **content):
    data = plugin_data_pb2.HParamsPluginData(version=hp_metadata.PLUGIN_DATA_VERSION, **content)
    meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name=hp_metadata.PLUGIN_NAME, content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=tag, metadata=meta)])


def hparams(hparam_dict, metric_dict, hparam_domain_discrete=None):
    """The experiment, session-start and session-end summaries of the hparams plugin."""
    if not isinstance(hparam_dict, dict):
        raise TypeError("parameter: hparam_dict should be a dictionary, nothing logged.")
    if not isinstance(metric_dict, dict):
        raise TypeError("parameter: metric_dict should be a dictionary, nothing logged.")
    domains = hparam_domain_discrete or {}
    if not isinstance(domains, dict):
        raise TypeError("parameter: hparam_domain_discrete should be a dictionary, nothing "
                        "logged.")
    for k, v in domains.items():
        if k not in hparam_dict or not isinstance(v, list) \
                or not all(isinstance(d, type(hparam_dict[k])) for d in v):
            raise TypeError(f"parameter: hparam_domain_discrete[{k}] should be a list of same "
                            f"type as hparam_dict[{k}].")
    infos, start = [], plugin_data_pb2.SessionStartInfo()
    for k, v in hparam_dict.items():
        if v is None:
            continue
        if isinstance(v, Tensor):
            v = float(_one(v, f"hparam {k!r}"))
        if isinstance(v, (int, float)):  # bool too: PyTorch logs it as a number
            field, kind = "number_value", "DATA_TYPE_FLOAT64"
        elif isinstance(v, str):
            field, kind = "string_value", "DATA_TYPE_STRING"
        else:
            raise ValueError("value should be one of int, float, str, bool, or torch.Tensor")
        setattr(start.hparams[k], field, v)
        domain = struct_pb2.ListValue(values=[struct_pb2.Value(**{field: d})
                                              for d in domains[k]]) if k in domains else None
        infos.append(api_pb2.HParamInfo(name=k, type=api_pb2.DataType.Value(kind),
                                        domain_discrete=domain))
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=[
        api_pb2.MetricInfo(name=api_pb2.MetricName(tag=k)) for k in metric_dict])
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))
    return (_hp_summary(hp_metadata.EXPERIMENT_TAG, experiment=experiment),
            _hp_summary(hp_metadata.SESSION_START_INFO_TAG, session_start_info=start),
            _hp_summary(hp_metadata.SESSION_END_INFO_TAG, session_end_info=end))
