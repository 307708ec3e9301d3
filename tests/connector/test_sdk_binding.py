"""The engine is as strict as a pybind11 binding of the SDK, and the
connector lives with that: typed option fields, non-arithmetic enums,
bound containers. Each strictness is one a C++ binding has and Python does
not, so code that passes here does not rely on leniency the vendor SDK lacks.
"""

import numpy as np
import pytest
from connector_tools import ConnectorRig

import aibrix_eic.engine as eic


# ------------------------------------------------------------ option fields
@pytest.mark.parametrize(
    "make, field, value",
    [
        (eic.InitOption, "log_dir", None),
        (eic.InitOption, "flag_file", None),
        (eic.InitOption, "log_level", 1),
        (eic.InitOption, "transport_type", 3),
        (eic.SetOption, "ns", None),
        (eic.SetOption, "ttl_second", 1.5),
        (eic.GetOption, "ns", 0),
        (eic.MemoryInfo, "type", 0),
        (eic.MemoryInfo, "cuda_id", None),
    ],
)
def test_option_fields_refuse_values_their_cpp_type_does_not_take(make, field, value):
    option = make()
    before = getattr(option, field)
    with pytest.raises(TypeError, match=f"{make.__name__}.{field}"):
        setattr(option, field, value)
    assert getattr(option, field) == before


def test_option_objects_take_no_undeclared_attribute():
    with pytest.raises(AttributeError):
        eic.InitOption().log_directory = "/tmp"  # a typo the binding would refuse


# ----------------------------------------------------------- open() and them
def test_open_with_no_log_dir_and_no_flag_file_connects():
    """Both default to None in the config; the binding refuses None for a
    std::string field, so the connector must leave such fields unset."""
    rig = ConnectorRig(remote_url="local://typed")
    try:
        assert rig.config.eic_log_dir is None and rig.config.eic_flag_file is None
        status = rig.conn.open()
        assert status.is_ok(), status
        assert rig.conn.health()["connected"]
    finally:
        rig.close()


class _RefusingOption(eic.InitOption):
    """An InitOption whose binding refuses every transport type."""

    def __setattr__(self, name, value):
        if name == "transport_type":
            raise TypeError("InitOption.transport_type: incompatible function arguments")
        super().__setattr__(name, value)


@pytest.mark.parametrize("fail_open", [True, False])
def test_a_binding_error_building_the_sdk_objects_is_an_open_failure_fail_open_honours(monkeypatch, fail_open):
    monkeypatch.setattr(eic, "InitOption", _RefusingOption)
    rig = ConnectorRig(remote_url="local://typed-refusing", fail_open=fail_open, probe_interval_s=60)
    try:
        status = rig.conn.open()
        if fail_open:  # the worker starts; the circuit is open until a probe connects
            assert status.is_ok(), status
            assert rig.conn.health()["breaker"] == "open"
        else:
            assert status.is_error() and "EIC open failed" in str(status.value), status
            assert "InitOption.transport_type" in str(status.value)
    finally:
        rig.close()


# -------------------------------------------------------------------- enums
def test_an_enum_built_from_an_unknown_int_is_accepted_as_pybind11_does():
    """py::enum_'s constructor casts any int, so TransportType(n) cannot tell
    the connector whether the SDK knows n: the config must."""
    unknown = eic.TransportType(1)
    assert str(unknown) == "TransportType.???" and int(unknown) == 1
    assert unknown == eic.TransportType(1) and unknown != eic.TransportType.TRANSPORT_GDR
    assert eic.TransportType(3) is eic.TransportType.TRANSPORT_GDR


@pytest.mark.parametrize("enum_type", [eic.StatusCode, eic.TransportType, eic.LogLevel, eic.MemoryType])
def test_enum_members_never_equal_plain_ints(enum_type):
    for member in enum_type:
        assert (member == int(member)) is False and (int(member) == member) is False
        assert member == enum_type(int(member)) and hash(member) == hash(enum_type(int(member)))
    first = next(iter(enum_type))
    with pytest.raises(TypeError):
        first < first  # noqa: B015 (non-arithmetic: no ordering)


@pytest.mark.parametrize(
    "yaml_line, expected",
    [
        ("eic_trans_type: 1", "expected one of 0 (TCP), 2 (RDMA), 3 (GDR), got 1"),
        ("eic_trans_type: 4", "expected one of 0 (TCP), 2 (RDMA), 3 (GDR), got 4"),
        ("eic_log_level: 5", "expected one of 0, 1, 2, 3, 4, got 5"),
        ("eic_log_level: '5'", "expected one of 0, 1, 2, 3, 4, got 5"),  # quoted means what unquoted does
        ("eic_log_level: debug", "expected an integer, got str 'debug'"),
    ],
)
def test_the_config_refuses_enum_values_the_sdk_does_not_document(tmp_path, yaml_line, expected):
    from aibrix_eic.config import ConfigError, EICConfig

    path = tmp_path / "eic.yaml"
    path.write_text(f"remote_url: local://\n{yaml_line}\n")
    with pytest.raises(ConfigError) as caught:
        EICConfig.load(str(path))
    assert caught.value.key == yaml_line.split(":")[0]
    assert str(path) in str(caught.value) and expected in str(caught.value)


@pytest.mark.parametrize("trans_type", [0, 2, 3])
@pytest.mark.parametrize("log_level", [0, 1, 2, 3, 4])
def test_every_documented_enum_value_opens(trans_type, log_level):
    rig = ConnectorRig(remote_url="local://typed-enums", eic_trans_type=trans_type, eic_log_level=log_level)
    try:
        assert rig.conn.open().is_ok() and rig.conn.health()["connected"]
    finally:
        rig.close()


# --------------------------------------------------------------- containers
def _engine_client() -> eic.Client:
    client = eic.Client()
    assert client.init("typed", "typed-containers", eic.InitOption()) == 0
    return client


BLOCK = np.zeros(8, np.uint8)  # real memory: the old engine copied from whatever it was given


def test_calls_refuse_a_plain_list_where_the_binding_takes_a_string_vector():
    client = _engine_client()
    buffers = eic.IOBuffers()
    buffers.append(BLOCK.ctypes.data, BLOCK.nbytes, False)
    with pytest.raises(TypeError, match="StringVector"):
        client.mset(["k"], buffers, eic.SetOption())
    with pytest.raises(TypeError, match="StringVector"):
        client.mget(["k"], eic.GetOption(), buffers)
    with pytest.raises(TypeError, match="StringVector"):
        client.mexist(["k"], eic.ExistOption())
    with pytest.raises(TypeError, match="StringVector"):
        client.mdel(["k"], eic.DelOption())


def test_calls_refuse_a_plain_list_where_the_binding_takes_io_buffers():
    client = _engine_client()
    keys = eic.StringVector()
    keys.append("k")
    with pytest.raises(TypeError, match="IOBuffers"):
        client.mset(keys, [(BLOCK.ctypes.data, BLOCK.nbytes, False)], eic.SetOption())
    with pytest.raises(TypeError, match="IOBuffers"):
        client.mget(keys, eic.GetOption(), [(BLOCK.ctypes.data, BLOCK.nbytes, False)])
    with pytest.raises(TypeError, match="IOBuffers"):
        client.register_memory([(BLOCK.ctypes.data, BLOCK.nbytes, True)], eic.MemoryInfo())


def test_a_string_vector_refuses_non_str_keys_from_its_constructor_too():
    with pytest.raises(TypeError):
        eic.StringVector([b"bytes-key"])
    assert list(eic.StringVector(["a", "b"])) == ["a", "b"]
