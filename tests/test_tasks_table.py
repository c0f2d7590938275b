"""scripts/tasks_table.py: chunking, POS and the shared pass, with the published systems."""
import json

from scripts.tasks_table import tasks_table


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_tasks_table_pairs_unmasked_with_causal_and_shared_with_alone(tmp_path):
    metrics = tmp_path / "metrics"
    assert tasks_table(metrics) == []  # nothing run: nothing said
    for seed, (f_all, f_none) in enumerate([(0.93, 0.90), (0.95, 0.92)]):
        write(metrics / "conll03_chunk" / f"chunk-all-seed{seed}.json", {"spans_chunks_f": f_all})
        write(metrics / "conll03_chunk" / f"chunk-none-seed{seed}.json", {"spans_chunks_f": f_none})
    write(metrics / "conll03_multitask" / "multitask-all-seed0.json",
          {"ents_f": 0.91, "spans_chunks_f": 0.925, "tag_acc": 0.95})
    write(metrics / "conll03" / "gemma3-mlp-layers12-all-seed0.json", {"ents_f": 0.92})
    write(metrics / "bench" / "multitask-speed.json", {"docs": 10, "shared_words_per_s": 900.0,
                                                       "three_pipelines_words_per_s": 300.0, "speedup": 3.0,
                                                       "cpu": "Some CPU", "cpu_flags": ["avx2"]})
    lines = tasks_table(metrics)
    row = next(line for line in lines if line.startswith("| CoNLL-2003 chunks"))
    assert row.startswith("| CoNLL-2003 chunks (F1) | 94.00 ± 1.41 | 91.00 ± 1.41 | 0, 1 | ACE + fine-tuning 92.50")
    assert not any(line.startswith("| CoNLL-2000") for line in lines)  # not run: no row
    shared = next(line for line in lines if line.startswith("One decoder pass"))
    assert "NER 91.00 (alone, same seeds: 92.00)" in shared
    assert "chunks 92.50 (alone, same seeds: 93.00)" in shared and "POS 95.00 (alone: not run)" in shared
    speed = next(line for line in lines if line.startswith("Words/s"))
    assert "one shared pass 900.0" in speed and "3.00x" in speed and "avx2" in speed
