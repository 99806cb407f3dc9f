"""A saved job (dumps/job_loads) is the job: a property over the specs of every kind."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monarch.job import JobError, JobTrait, LocalJob, ProcessJob, SlurmJob, SSHJob, job_loads

names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True)
counts = st.dictionaries(names, st.integers(1, 64), min_size=1, max_size=3)
destinations = st.lists(st.from_regex(r"[a-z0-9][a-z0-9.@-]{0,15}", fullmatch=True), min_size=1)


def jobs() -> st.SearchStrategy[JobTrait]:
    return st.one_of(
        st.builds(LocalJob, st.lists(names, min_size=1, max_size=3).map(tuple)),
        st.builds(ProcessJob, counts, st.dictionaries(names, st.text(max_size=8), max_size=2)),
        st.builds(
            SlurmJob,
            counts,
            python_exe=st.sampled_from(["python", "/opt/venv/bin/python"]),
            monarch_port=st.integers(0, 65535),
            partition=st.none() | names,
            exclusive=st.booleans(),
        ),
        st.builds(
            SSHJob,
            st.dictionaries(names, destinations, min_size=1, max_size=2),
            ssh_args=st.lists(st.sampled_from(["-p", "2222", "-oBatchMode=yes", "-A"])),
            monarch_port=st.integers(0, 65535),
        ),
    )


@given(jobs())
def test_a_saved_job_loads_as_the_same_job(job: JobTrait) -> None:
    loaded = job_loads(job.dumps())
    assert type(loaded) is type(job)
    assert loaded._spec() == job._spec()
    assert loaded.can_run(job) and job.can_run(loaded)
    assert vars(loaded) == vars(job)  # all of it: its id, secret, folders, hosts


@given(st.binary(max_size=64))
def test_bytes_that_are_not_a_saved_job_are_a_job_error(data: bytes) -> None:
    with pytest.raises(JobError):
        job_loads(data)


def test_a_job_saved_by_another_format_is_refused() -> None:
    with pytest.raises(JobError, match="saved in format 0; this version reads 1"):
        job_loads(pickle.dumps((0, LocalJob())))
