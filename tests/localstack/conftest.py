"""crest's harness for LocalStack's SQS tests (tests/aws/services/sqs, vendored unchanged).

The tests run against a crest SQS gateway that tests/localstack.rs starts, never against a
LocalStack: the endpoint, the keys and the accounts (crest namespaces) come from the
environment (TEST_AWS_ENDPOINT_URL, TEST_AWS_ACCESS_KEY_ID, TEST_AWS_SECRET_ACCESS_KEY,
TEST_AWS_ACCOUNT_ID and their SECONDARY_ counterparts), read by localstack.testing.config.
The fixtures are LocalStack's own (the localstack-core package), so each test sees what it
sees in LocalStack's CI; only the session-wide ones below, which LocalStack keeps in its
repository's conftest files rather than in the package, are written here.
"""

import os

import pytest
from localstack_snapshot.snapshots import SnapshotSession
from localstack_snapshot.snapshots.transformer import RegexTransformer

os.environ.setdefault("TEST_SKIP_LOCALSTACK_START", "1")
os.environ["LOCALSTACK_INTERNAL_TEST_RUN"] = "1"
# The endpoint serves SQS alone: tests ask no other service (STS) for the account or region.
os.environ["SERVICES"] = "sqs"

pytest_plugins = [
    "localstack.testing.pytest.fixtures",
    "localstack_snapshot.pytest.snapshot",
    "localstack.testing.pytest.filters",
    "localstack.testing.pytest.fixture_conflicts",
    "localstack.testing.pytest.marking",
    "localstack.testing.pytest.validation_tracking",
]


@pytest.fixture(scope="session")
def aws_session():
    from localstack.testing.aws.util import base_aws_session

    return base_aws_session()


@pytest.fixture(scope="session")
def secondary_aws_session():
    from localstack.testing.aws.util import secondary_aws_session

    return secondary_aws_session()


@pytest.fixture(scope="session")
def aws_client_factory(aws_session):
    from localstack.testing.aws.util import base_aws_client_factory

    return base_aws_client_factory(aws_session)


@pytest.fixture(scope="session")
def secondary_aws_client_factory(secondary_aws_session):
    from localstack.testing.aws.util import base_aws_client_factory

    return base_aws_client_factory(secondary_aws_session)


@pytest.fixture(scope="session")
def aws_client(aws_client_factory):
    from localstack.testing.aws.util import base_testing_aws_client

    return base_testing_aws_client(aws_client_factory)


@pytest.fixture(scope="session")
def secondary_aws_client(secondary_aws_client_factory):
    from localstack.testing.aws.util import base_testing_aws_client

    return base_testing_aws_client(secondary_aws_client_factory)


@pytest.fixture(scope="function")
def snapshot(request, _snapshot_session: SnapshotSession, account_id, region_name):
    """As LocalStack's tests/aws/conftest.py sets it up for its SQS tests."""
    from localstack.testing.snapshots.transformer_utility import (
        SNAPSHOT_BASIC_TRANSFORMER,
        TransformerUtility,
    )
    from localstack.utils.aws.arns import get_partition

    _snapshot_session.transform = TransformerUtility
    _snapshot_session.add_transformer(RegexTransformer(account_id, "1" * 12), priority=2)
    _snapshot_session.add_transformer(RegexTransformer(region_name, "<region>"), priority=2)
    _snapshot_session.add_transformer(
        RegexTransformer(f"arn:{get_partition(region_name)}:", "arn:<partition>:"), priority=2
    )
    _snapshot_session.add_transformer(_snapshot_session.transform.remove_key("x-localstack"))
    _snapshot_session.add_transformer(SNAPSHOT_BASIC_TRANSFORMER, priority=2)
    return _snapshot_session


_results = None


def pytest_runtest_logreport(report):
    """Writes each test's outcome as a JSON line to CREST_LOCALSTACK_RESULTS: a test's call
    phase, or the setup phase that failed or skipped it (tests/localstack.rs reads them)."""
    global _results
    path = os.environ.get("CREST_LOCALSTACK_RESULTS")
    if not path or (report.when != "call" and report.outcome == "passed"):
        return
    if report.when == "teardown" and report.outcome != "failed":
        return
    import json

    if _results is None:
        _results = open(path, "a", encoding="utf-8")
    summary = ""
    if report.outcome != "passed":
        summary = str(report.longrepr.reprcrash.message if hasattr(report.longrepr, "reprcrash") and report.longrepr.reprcrash else report.longrepr)
        summary = summary.strip().splitlines()[0][:300] if summary.strip() else ""
    record = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "summary": summary}
    _results.write(json.dumps(record) + "\n")
    _results.flush()


def pytest_collection_modifyitems(config, items):
    """Skips the tests LocalStack marks as its own: those that test LocalStack itself
    (`aws.only_localstack`) or reach into its process (`requires_in_process`)."""
    own = pytest.mark.skip(reason="LocalStack's own: tests LocalStack itself, not SQS")
    for item in items:
        if item.get_closest_marker("aws_only_localstack") or item.get_closest_marker(
            "requires_in_process"
        ):
            item.add_marker(own)
