"""The records a launch's processes exchange (``distgrad.launch.contracts``): checked
when made and when they arrive, every error naming the record and the field; carried by
the codec as they are; refused by name where a dict or another version's record comes."""
import importlib

import msgpack
import numpy as np
import pytest

from distgrad import codec
from distgrad.references import lookup, split_reference
from distgrad.launch import contracts
from distgrad.launch.contracts import (ContractError, HostInfo, ModelSlice, PipelineSetup,
                                       RemoteSetup, StageInfo, StepResult, StepWork, expect)
from distgrad.launch.models import mlp


def _slice(**changes):
    fields = dict(factory=mlp, factory_kwargs={"sizes": [4, 8, 2]}, seed=0,
                  parts=[(0, 0, 2)], checkpoint_activations="none", deferred_weights=[])
    return ModelSlice(**dict(fields, **changes))


def _setup(**changes):
    fields = dict(model=_slice(), worker=0, stage=0, stages=2, num_stages=2,
                  pipeline=["worker1", "worker2"], replica=0, replicas=1, store=None,
                  schedule="gpipe", optimizer=object, optimizer_kwargs={"lr": 0.1},
                  loss="mse", hooks=[], offload={}, heartbeat_timeout=3, rendezvous_timeout=60.0,
                  simulated_link=None, timeout=120.0, trace=False, resume_from=None)
    return PipelineSetup(**dict(fields, **changes))


@pytest.mark.parametrize("make,message", [
    (lambda: StepWork(step=1, micro_batches=2.0, inputs=None, targets=None),
     "StepWork.micro_batches: expected int, got float 2.0"),
    (lambda: StepWork(step=True, micro_batches=2, inputs=None, targets=None),
     "StepWork.step: expected int, got bool True"),
    (lambda: StepWork(step=1, micro_batches=2, inputs=np.zeros(3), targets=None),
     "StepWork.inputs: expected list or None, got ndarray"),
    (lambda: _setup(pipeline=["worker1", 2]),
     r"PipelineSetup.pipeline\[1\]: expected str, got int 2"),
    (lambda: _setup(store=("host0", "29500")),
     r"PipelineSetup.store: expected tuple\[str, int\] or None, got tuple \('host0', '29500'\)"),
    (lambda: _setup(model=_slice(parts=[(0, 2)])),
     r"ModelSlice.parts\[0\]: expected 3 items, got 2"),
    (lambda: _setup(model={"seed": 0}), "PipelineSetup.model: expected ModelSlice, got dict"),
    (lambda: StepResult(loss=1.0, correct=1, count=2, reported={"norm": "big"}, seconds_ago=0.0),
     r"StepResult.reported\['norm'\]: expected float, got str 'big'"),
], ids=["int", "bool-is-no-int", "list", "list-item", "optional-tuple", "tuple-length",
        "nested-record", "dict-value"])
def test_a_field_of_the_wrong_type_is_refused_naming_the_record_and_the_field(make, message):
    with pytest.raises(ContractError, match=message):
        make()


def test_records_travel_through_the_codec_as_they_are():
    setup = _setup(store=("host0", 29500), hooks=[(mlp, {"at": 3})])
    back = codec.loads(codec.dumps(setup, _ByReference()), _ByReference())
    assert back == setup and type(back.model) is ModelSlice
    work = StepWork(step=-3, micro_batches=2, inputs=[np.arange(4.0), np.ones(2)], targets=None)
    back = codec.loads(codec.dumps(work))
    assert back.step == -3 and [list(a) for a in back.inputs] == [[0, 1, 2, 3], [1, 1]]
    result = StepResult.of({"loss": np.float32(0.5), "correct": np.int64(3), "count": 4},
                           {"grad_norm.stage0": 2.0})
    assert codec.loads(codec.dumps(result)) == result and type(result.correct) is int
    for answer in (StageInfo(parameters=120, pid=7), HostInfo("host1", "10.0.0.2")):
        assert codec.loads(codec.dumps(answer)) == answer


def test_a_record_of_another_shape_is_refused_on_arrival_naming_its_fields():
    body, _ = codec.encode(StepWork(step=1, micro_batches=2, inputs=None, targets=None))
    ext = msgpack.unpackb(body, raw=False)
    older = msgpack.packb(msgpack.ExtType(ext.code, msgpack.packb([1, 2, None])))
    # the codec's error for malformed data, with the record's own words
    with pytest.raises(codec.CodecError, match=r"ContractError: StepWork: expected its 4 "
                                               r"fields \(step, micro_batches, inputs, "
                                               r"targets\), got 3 \(does the sender run"):
        codec.decode(older)
    tampered = msgpack.packb(msgpack.ExtType(ext.code, msgpack.packb([1, "2", None, None])))
    with pytest.raises(codec.CodecError, match="StepWork.micro_batches: expected int, got str"):
        codec.decode(tampered)


def test_what_a_function_receives_is_checked_by_name():
    with pytest.raises(ContractError, match=r"setup\(spec\): spec: expected PipelineSetup, "
                                            r"got dict"):
        from distgrad.launch import stage
        stage.setup({"stage": 0})
    with pytest.raises(ContractError, match=r"step\(seq, steps\): steps\[1\]: expected "
                                            r"StepWork, got tuple"):
        expect([StepWork(1, 1, None, None), (2, 1, None, None)], list[StepWork],
               "step(seq, steps): steps")
    with pytest.raises(ContractError, match="RemoteStage"):
        from distgrad.launch.remote_stage import RemoteStage
        RemoteStage({"stage": 0})
    assert RemoteSetup(model=_slice(), stage=0, stages=1, timeout=0.0, trace=False,
                       resume_from=None).timeout == 0.0
    assert contracts.__all__  # every record is public, for programs that drive stages


class _ByReference:
    """A codec context that carries functions and classes by reference (as RPC does)."""
    functions_by_reference = True

    @staticmethod
    def resolve(ref):
        return lookup(ref, importlib.import_module(split_reference(ref)[0]))
