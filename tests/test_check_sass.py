"""The SASS checker's loop analysis, on hand-written SASS (no GPU, no toolkit)."""
import importlib.util
import pathlib

spec = importlib.util.spec_from_file_location("check_sass", pathlib.Path(__file__).with_name("check_sass.py"))
check_sass = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_sass)


def sass(*lines):
    return "\n".join(f"        /*{addr:04x}*/                   {text} ;" for addr, text in lines)


def local_in_mainloops(body):
    code, loops = check_sass.mainloops(body)
    return [a for a, t in code if check_sass.LOCAL.search(t) and any(lo <= a <= hi for lo, hi in loops)]


def test_spill_inside_the_hgmma_loop_is_found():
    body = sass((0x10, "MOV R1, R2"), (0x20, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24"),
                (0x30, "LDL R3, [R1]"), (0x40, "@P0 BRA 0x20"), (0x50, "EXIT"))
    assert local_in_mainloops(body) == [0x30]


def test_spill_in_the_outer_tile_loop_is_not_in_the_mainloop():
    body = sass((0x10, "LDL R3, [R1]"), (0x20, "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24"),
                (0x30, "@P0 BRA 0x20"), (0x40, "STL [R1], R3"), (0x50, "@P1 BRA 0x10"), (0x60, "EXIT"))
    assert local_in_mainloops(body) == []


def narrow_in_mainloops(body):
    return [a for a, t in check_sass.narrow_mmas_in_mainloops(*check_sass.mainloops(body))]


def test_a_64x8_mma_in_the_mainloop_is_found():
    # CuTe's selector falling back to its narrowest atom.
    body = sass((0x10, "MOV R1, R2"), (0x20, "HGMMA.64x8x16.F32.BF16 R24, gdesc[UR24], RZ, !UPT"),
                (0x30, "HGMMA.64x80x16.F32.BF16 R28, gdesc[UR4], R28"), (0x40, "@P0 BRA 0x20"), (0x50, "EXIT"))
    assert narrow_in_mainloops(body) == [0x20]


def test_wide_mmas_and_a_64x8_outside_the_loop_pass():
    body = sass((0x10, "QGMMA.64x8x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24"),
                (0x20, "HGMMA.64x40x16.F32.BF16 R28, gdesc[UR4], R28"), (0x30, "QGMMA.64x80x32.F32.E4M3.E4M3 R32, gdesc[UR6], R32"),
                (0x40, "@P0 BRA 0x20"), (0x50, "EXIT"))
    assert narrow_in_mainloops(body) == []


def test_out_of_line_wait_retry_is_no_loop():
    # 0x20 jumps out to a retry path at 0x60, which returns to 0x30: not a loop
    # around the HGMMA and the LDL.
    body = sass((0x10, "MOV R1, R2"), (0x20, "@!P0 BRA 0x60"), (0x30, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24"),
                (0x40, "LDL R3, [R1]"), (0x50, "EXIT"), (0x60, "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR8], R2"),
                (0x70, "@!P0 BRA 0x60"), (0x80, "BRA 0x30"))
    assert local_in_mainloops(body) == []


def test_split_kv_kernels_need_no_tma_store():
    # fwd::SplitEpilogue writes float32 partials from registers.
    name = ("_ZN6flash33fwd14forward_kernelINS0_6KernelINS0_8MainloopINS0_9FwdTraitsIN7cutlass10bfloat16_tELi128E"
            "EEENS0_13SplitEpilogueIS9_EENS_18SplitTileSchedulerEEEEEvNT_6ParamsE")
    assert check_sass.required(name) == ("HGMMA", "UTMALDG", "USETMAXREG")
    assert "UTMASTG" in check_sass.required(name.replace("13SplitEpilogue", "8Epilogue"))


def test_fp8_kernels_need_qgmma():
    name = "_ZN6flash33fwd14forward_kernelINS0_9FwdTraitsIN7cutlass12float_e4m3_tELi128E"
    assert check_sass.required(name) == ("QGMMA", "UTMALDG", "UTMASTG", "USETMAXREG")
    body = sass((0x10, "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24"), (0x20, "LDL R3, [R1]"),
                (0x30, "@P0 BRA 0x10"), (0x40, "EXIT"))
    code, loops = check_sass.mainloops(body, check_sass.hot_ops(name))
    assert loops == [(0x10, 0x30)]


def test_spill_in_the_fp8_transpose_loop_is_found():
    name = "_ZN6flash33fwd14forward_kernelINS0_9FwdTraitsIN7cutlass12float_e4m3_tELi128E"
    body = sass((0x10, "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR4], R24"), (0x20, "@P0 BRA 0x10"),
                (0x30, "LDL R3, [R1]"), (0x40, "LDSM.16.MT88.4 R4, [R3]"), (0x50, "@P1 BRA 0x30"), (0x60, "EXIT"))
    code, loops = check_sass.mainloops(body, check_sass.hot_ops(name))
    assert loops == [(0x10, 0x20), (0x30, 0x50)]


def test_the_variant_without_warp_specialization_needs_no_setmaxnreg():
    with_producer = ("_ZN6flash33fwd14forward_kernelINS0_6KernelINS0_8MainloopINS0_9FwdTraitsIN7cutlass10bfloat16_tELi128E"
                     "XtlNS0_7VariantELb1ELb1ELb1ELb1ELNS_5DTypeE0EEEEEEENS0_8EpilogueIS9_EENS_23PersistentTileScheduler"
                     "EEEEEvNT_6ParamsE")
    without = ("_ZN6flash33fwd14forward_kernelINS0_10KernelNoWSINS0_8MainloopINS0_9FwdTraitsIN7cutlass10bfloat16_tELi128E"
               "XtlNS0_7VariantELb1ELb1ELb1ELb0ELNS_5DTypeE0EEEEEEENS0_8EpilogueIS9_EENS_23PersistentTileScheduler"
               "EEEEEvNT_6ParamsE")
    assert "USETMAXREG" in check_sass.required(with_producer)
    assert check_sass.required(without) == ("HGMMA", "UTMALDG", "UTMASTG")


def test_the_backward_chain_kernels_are_recognised():
    assert check_sass.chain_ops("_ZN6flash33bwd17preprocess_kernelIN7cutlass10bfloat16_tEEEvNS0_16PreprocessParamsIT_EE") == (
        "PREEXIT",)
    assert check_sass.chain_ops("_ZN6flash33bwd15backward_kernelINS0_9BwdTraitsIN7cutlass10bfloat16_tELi128ELb0EEEEEvN"
                                "S0_6KernelIT_E6ParamsE") == ("PREEXIT",)
    assert check_sass.chain_ops("_ZN6flash33bwd17sum_groups_kernelIN7cutlass10bfloat16_tEEEvNS0_15SumGroupsParamsIT_EE") == (
        "ACQBULK",)
    assert check_sass.chain_ops("_ZN6flash33fwd14forward_kernelINS0_9FwdTraitsIN7cutlass10bfloat16_tELi128E") == ()


def test_a_chain_kernel_without_its_wait_is_found():
    name = "_ZN6flash33bwd21postprocess_dq_kernelINS0_9BwdTraitsIN7cutlass10bfloat16_tELi128ELb0EEEEEvNS0_17Post"
    waits = sass((0x10, "PREEXIT"), (0x20, "ACQBULK"), (0x30, "LDG.E.128 R4, desc[UR4][R2.64]"), (0x40, "EXIT"))
    races = sass((0x10, "PREEXIT"), (0x20, "LDG.E.128 R4, desc[UR4][R2.64]"), (0x30, "EXIT"))
    assert check_sass.missing_chain_ops(name, waits) == []
    assert check_sass.missing_chain_ops(name, races) == ["ACQBULK"]
