"""scripts/sass_compare.py's judgement, on SASS text (no compiler): a refactor that only renames registers or
changes immediates reads as identical; one that adds or removes an instruction is reported with its opcodes."""

from __future__ import annotations

from scripts.sass_compare import compare, kernel_name, normalise


def test_normalise_drops_register_names_and_immediates() -> None:
    assert normalise("FFMA R12, R3, UR4, R7") == normalise("FFMA R40, R1, UR9, R2")
    assert normalise("ISETP.GT.AND P0, PT, R2, 0x3f, PT") == normalise("ISETP.GT.AND P3, PT, R9, 0x10, PT")
    assert normalise("FFMA R1, R2, R3, R4") != normalise("FADD R1, R2, R3")


def test_compare_reports_identical_changed_and_missing_kernels() -> None:
    old = {"k_same": ["FFMA R", "HMMA R"], "k_changed": ["FFMA R", "IMAD R"], "k_gone": ["EXIT"]}
    new = {"k_same": ["FFMA R", "HMMA R"], "k_changed": ["FFMA R", "FADD R", "LEA R"], "k_new": ["EXIT"]}
    lines = dict(line.split(": ", 1) for line in compare(old, new))
    assert lines["k_same"].startswith("identical")
    assert "2 -> 3 instructions" in lines["k_changed"]
    assert "'FADD': 1" in lines["k_changed"] and "'LEA': 1" in lines["k_changed"]
    assert "removed {'IMAD': 1}" in lines["k_changed"]
    assert lines["k_gone"] == "only in the old tree"
    assert lines["k_new"] == "only in the new tree"


def test_kernel_names_ignore_the_anonymous_namespace_hash() -> None:
    a = "_ZN2gs4attn55_GLOBAL__N__243e036e_22_attention_dkdv_sm90_cu_e705952016dkdv_sm90_kernelILb0EEEv"
    b = "_ZN2gs4attn55_GLOBAL__N__c08bac83_22_attention_dkdv_sm90_cu_e705952016dkdv_sm90_kernelILb0EEEv"
    assert kernel_name(a) == kernel_name(b)
    assert kernel_name(a) != kernel_name(b.replace("ILb0", "ILb1"))  # another instantiation stays another kernel
