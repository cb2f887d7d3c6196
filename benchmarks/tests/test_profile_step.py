"""benchmarks/micro/profile_step.py: the groups a profiled op's self time is counted in."""

from benchmarks.micro.profile_step import group_of


def test_ops_fall_in_their_groups_and_compiled_graphs_are_inductor_work_not_other():
    assert group_of("aten::mm") == group_of("aten::addmm") == "matrix products"
    assert group_of("aten::copy_") == "copies" and group_of("aten::random_") == "dropout"
    assert group_of("aten::native_layer_norm_backward") == "LayerNorm"
    # the names torch.compile's calls carry in a profile (torch 2.14)
    assert (
        group_of("## Call CompiledFxGraph ffa4y462chzyu4fndiqzoi4jdmjtsw73d34zt2ax6uulsugn6s4x ##")
        == "inductor kernels"
    )
    assert group_of("CompiledFunctionBackward") == "inductor kernels"
    assert group_of("aten::some_new_op") == "other"
