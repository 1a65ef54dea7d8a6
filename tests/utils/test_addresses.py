"""Which address a process binds and advertises (``distgrad/utils/addresses.py``): toward
the rendezvous host unless a setting says otherwise, in the documented order, with errors
that name the setting; what a server binds for MASTER_ADDR; why nobody answers."""
import socket

import pytest

from distgrad.utils import addresses
from distgrad.utils.ports import free_port

pytestmark = pytest.mark.timeout(30)


def test_a_rendezvous_on_loopback_or_none_keeps_everything_on_loopback():
    for toward in (None, "127.0.0.1", "localhost"):
        choice = addresses.choose(toward, env={})
        assert (choice.bind, choice.advertise) == ("127.0.0.1", "127.0.0.1")
    assert addresses.choose("::1", env={}).bind == "::1"


def test_settings_win_in_their_order_and_per_purpose():
    lo = {"DISTGRAD_SOCKET_IFNAME": "lo"}
    assert addresses.choose("127.0.0.1", env=lo).why == "DISTGRAD_SOCKET_IFNAME=lo"
    both = {"DISTGRAD_BIND_ADDR": "127.0.0.1", "DISTGRAD_SOCKET_IFNAME": "nonesuch0"}
    assert addresses.choose("127.0.0.1", env=both).why == "DISTGRAD_BIND_ADDR=127.0.0.1"
    # PyTorch's variables: TensorPipe's for RPC, gloo's for process groups
    assert addresses.choose(None, "rpc", env={"TP_SOCKET_IFNAME": "lo"}).why.startswith("TP_")
    assert addresses.choose(None, "pg", env={"TP_SOCKET_IFNAME": "lo"}).why == "no rendezvous host"
    assert addresses.choose(None, "pg", env={"GLOO_SOCKET_IFNAME": "lo,eth0"}).why \
        == "GLOO_SOCKET_IFNAME=lo,eth0"
    wildcard = addresses.choose("127.0.0.1", env={"DISTGRAD_BIND_ADDR": "0.0.0.0"})
    assert (wildcard.bind, wildcard.advertise) == ("0.0.0.0", "127.0.0.1")


@pytest.mark.parametrize("env, message", [
    ({"DISTGRAD_SOCKET_IFNAME": "nonesuch0"}, "DISTGRAD_SOCKET_IFNAME='nonesuch0': this host "
                                              "has no interface 'nonesuch0' (it has lo"),
    ({"TP_SOCKET_IFNAME": "nonesuch0"}, "TP_SOCKET_IFNAME='nonesuch0'"),
    ({"DISTGRAD_BIND_ADDR": "192.0.2.77"}, "DISTGRAD_BIND_ADDR='192.0.2.77' is not an address "
                                           "of this host"),
    ({"DISTGRAD_BIND_ADDR": "eth0"}, "is not an IP address of this host (for an interface "
                                     "name, set DISTGRAD_SOCKET_IFNAME)"),
])
def test_a_setting_that_cannot_be_used_is_named(env, message):
    with pytest.raises(addresses.AddressError, match=message.replace("(", r"\(").replace(")", r"\)")):
        addresses.choose("127.0.0.1", env=env)


def test_a_rendezvous_host_that_does_not_resolve_is_named():
    with pytest.raises(addresses.AddressError, match="rendezvous host 'no-such-host.invalid' "
                                                     "does not resolve"):
        addresses.choose("no-such-host.invalid", env={})


def test_what_a_server_at_master_addr_binds():
    assert addresses.listen_address("127.0.0.1") == "127.0.0.1"
    assert addresses.listen_address("localhost") == "127.0.0.1"
    assert addresses.listen_address("[::1]") == "::1"
    # an address that is not this host's (a service or NAT address in front of it)
    assert addresses.listen_address("192.0.2.77") == "0.0.0.0"


def test_endpoints_and_why_nobody_answers():
    assert addresses.endpoint("fd00::2", 5) == "tcp://[fd00::2]:5"
    assert addresses.host_port("tcp://[fd00::2]:5") == ("fd00::2", 5)
    assert addresses.endpoint_host("ipc:///tmp/x.sock") is None
    assert addresses.is_ipv6("tcp://[::1]:5") and not addresses.is_ipv6("tcp://10.0.0.1:5")
    port = free_port()
    assert "nothing listens at 127.0.0.1:%d (connection refused)" % port \
        == addresses.diagnose(f"tcp://127.0.0.1:{port}")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert "accepts connections" in addresses.diagnose(f"tcp://127.0.0.1:{port}")
