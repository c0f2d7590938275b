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
    write(metrics / "conll03_pos" / "pos-all-seed2.json", {"tag_acc": 0.96})  # causal not run
    shared = metrics / "conll03_multitask"
    write(shared / "multitask-all-seed0.json", {"ents_f": 0.91, "spans_chunks_f": 0.925, "tag_acc": 0.95})
    # the dev curve: training keeps the checkpoint of the best weighted score (step 200)
    curve = [{"step": step, "score": score, "scores": {"ents_f": ents, "spans_chunks_f": 90.0, "tag_acc": 95.0}}
             for step, score, ents in ((100, 0.90, 94.0), (200, 0.93, 93.0), (300, 0.93, 96.0))]
    (shared / "multitask-all-seed0.log.jsonl").write_text("\n".join(map(json.dumps, curve)))
    write(shared / "multitask-ner2-all-seed0.json", {"ents_f": 0.915, "spans_chunks_f": 0.92, "tag_acc": 0.95})
    write(shared / "multitask-ner2-all-seed0.train.json",
          {"wall_s": 60.0, "command": ["spacy", "train", "--components.ner.model.tok2vec.grad_factor", "2.0"]})
    write(metrics / "conll03" / "gemma3-mlp-layers12-all-seed0.json", {"ents_f": 0.92})
    write(metrics / "conll03" / "gemma3-mlp-layers12-all-seed1.json", {"ents_f": 0.10})  # not a seed of the pass
    write(metrics / "bench" / "multitask-speed.json", {"docs": 10, "shared_words_per_s": 900.0,
                                                       "three_pipelines_words_per_s": 300.0, "speedup": 3.0,
                                                       "cpu": "Some CPU", "cpu_flags": ["avx2"]})
    lines = tasks_table(metrics)
    row = next(line for line in lines if line.startswith("| CoNLL-2003 chunks"))
    assert row.startswith("| CoNLL-2003 chunks (F1) | 94.00 ± 1.41 (seeds 0, 1) | 91.00 ± 1.41 (seeds 0, 1) | "
                          "ACE + fine-tuning 92.50")
    pos = next(line for line in lines if line.startswith("| CoNLL-2003 POS"))
    assert pos.startswith("| CoNLL-2003 POS (accuracy) | 96.00 (seed 2) | – |")  # each column its own seeds
    assert not any(line.startswith("| CoNLL-2000") for line in lines)  # not run: no row
    assert any(line.startswith("One decoder pass for all three") for line in lines)
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| `multitask") or line.startswith("| each")}
    assert rows["| `multitask-all` (grad_factor 1 for all)"] == (
        "| `multitask-all` (grad_factor 1 for all) | 0 | 93.00 / 91.00 | 90.00 / 92.50 | 95.00 / 95.00 |")
    assert rows["| `multitask-ner2-all` (grad_factor ner 2.0)"].endswith("| 0 | – / 91.50 | – / 92.00 | – / 95.00 |")
    assert rows["| each task alone"] == "| each task alone | 0 | – / 92.00 | – / 93.00 | not run |"
    speed = next(line for line in lines if line.startswith("Words/s"))
    assert "one shared pass 900.0" in speed and "3.00x" in speed and "avx2" in speed
