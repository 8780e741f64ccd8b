"""``bench.profile_stages``: every stage of the pipeline can be profiled, the read stage (the batch
iterator's steps, in the read thread) included; a stage name it does not know is refused."""

import pytest

from bench.profile_stages import main

JOB = ["--", "--rows", "4000", "--batch-size", "1000", "--minibatch-size", "250", "--no-progress"]


def test_the_read_stage_is_profiled_with_the_batch_iterator_inside_it(capsys):
    assert main(["--stages", "read", "--mode", "cprofile", "--top", "200", *JOB]) == 0  # one stage: Python 3.12
    read = capsys.readouterr().out.split("=== stage read")[1]
    assert "_trainer.py:" in read and "(_source)" in read       # the trainer's batch iterator ran in it
    assert "_synthetic.py:" in read                             # the data was made there
    assert "(_train)" not in read and "(_prepare)" not in read  # and no other stage's work


def test_an_unknown_stage_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--stages", "raed", *JOB])
    assert "read,prepare,place,train" in capsys.readouterr().err
