"""What admits a connection: credentials, verifiers, and the ZAP answers (no processes)."""
import hashlib

import pytest
import zmq
from zmq.utils import z85

from distgrad.rpc.admission import Admission
from distgrad.rpc.credentials import Credential, prove, proven, world_secret
from distgrad.rpc.options import RpcBackendOptions


def _zap(mechanism, *credentials):
    return [b"1.0", b"7", b"", b"10.0.0.9", b"", mechanism, *credentials]


def test_plain_admits_a_member_as_its_rank_and_nobody_else():
    members = [Credential("plain") for _ in range(3)]
    admission = Admission("w0", "plain", [c.verifier for c in members])
    for rank, c in enumerate(members):
        opts = c.client_options(rank, None)
        answer = admission.answer(_zap(b"PLAIN", opts["plain_username"], opts["plain_password"]))
        assert answer[2:5] == [b"200", b"OK", b"%d" % rank]   # User-Id: the rank
    token = members[1].client_options(1, None)["plain_password"]
    assert members[1].verifier == hashlib.sha256(token).hexdigest()   # peers hold the hash
    for user, password, why in [(b"0", token, b"wrong credentials for rank 0"),  # as another
                                (b"1", b"guess", b"wrong credentials for rank 1"),
                                (b"7", token, b"not a rank of this world"),
                                (b"01", token, b"not a rank of this world")]:
        answer = admission.answer(_zap(b"PLAIN", user, password))
        assert answer[2] == b"400" and why in answer[3]
    assert admission.answer(_zap(b"CURVE", b"x" * 32))[2] == b"400"   # another mechanism
    assert admission.answer(_zap(b"PLAIN", b"1"))[2] == b"400"        # malformed
    assert admission.refused == 6


def test_curve_admits_by_public_key():
    members = [Credential("curve") for _ in range(2)]
    admission = Admission("w0", "curve", [c.verifier for c in members])
    key = z85.decode(members[1].verifier.encode())
    assert admission.answer(_zap(b"CURVE", key))[2:5] == [b"200", b"OK", b"1"]
    stranger, _ = zmq.curve_keypair()
    assert admission.answer(_zap(b"CURVE", z85.decode(stranger)))[2] == b"400"
    opts = members[0].client_options(0, members[1].verifier)
    assert opts["curve_serverkey"] == members[1].verifier.encode()


def test_the_world_secret_proves_without_being_sent(monkeypatch):
    proof = prove(b"s", "registration", ["w1", 1])
    assert proven(b"s", "registration", ["w1", 1], proof)
    assert not proven(b"t", "registration", ["w1", 1], proof)
    assert not proven(b"s", "table", ["w1", 1], proof)       # labelled: not reusable
    assert not proven(b"s", "registration", ["w1", 2], proof)
    assert b"s" not in proof.encode() and not proven(b"s", "registration", ["w1", 1], None)
    monkeypatch.setenv("DISTGRAD_WORLD_SECRET", "from-env")
    assert world_secret(RpcBackendOptions()) == b"from-env"
    assert world_secret(RpcBackendOptions(world_secret="given")) == b"given"
    assert RpcBackendOptions().mechanism == "plain"
    assert RpcBackendOptions(authenticate=False).mechanism == "none"
    with pytest.raises(ValueError, match="authenticate"):
        RpcBackendOptions(authenticate="yes")
