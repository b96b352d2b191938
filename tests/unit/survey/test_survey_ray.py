"""How the Ray engine sizes its actor pool (no Ray needed)."""

from __future__ import annotations


def test_ray_actors_are_one_per_gpu_else_one_per_node():
    from headscope.survey.ray_engine import plan_actors

    gpu_nodes = [{"Alive": True, "Resources": {"CPU": 16, "GPU": 2}}] * 2
    assert plan_actors({"CPU": 32, "GPU": 4}, gpu_nodes, None) == (4, {"num_gpus": 1, "num_cpus": 1})
    cpu_nodes = [{"Alive": True, "Resources": {"CPU": 8}}, {"Alive": True, "Resources": {"CPU": 4}}]
    cpu_nodes.append({"Alive": False, "Resources": {"CPU": 64}})
    assert plan_actors({"CPU": 12}, cpu_nodes, None) == (2, {"num_cpus": 4})
    assert plan_actors({"CPU": 12}, cpu_nodes, 3) == (3, {"num_cpus": 4})


def test_every_actor_gets_a_block_while_there_are_pictures_for_it():
    """13 pictures at batch 8 made one block: the second actor loaded the model and waited."""
    from headscope.survey.ray_engine import plan_blocks

    assert plan_blocks(13, 8, 2) == 2
    assert plan_blocks(1, 8, 4) == 1 and plan_blocks(0, 8, 2) == 1
    assert plan_blocks(3, 1, 8) == 3  # no more blocks than pictures
    assert plan_blocks(640, 8, 2) == 20  # about four batches a block
    assert plan_blocks(10**7, 1, 2) == 1000
