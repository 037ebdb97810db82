"""crest's harness: the one name test_sqs.py takes from LocalStack's Lambda tests (the path
of the Lambda handler its Lambda-triggered tests deploy), without those tests."""

import os

THIS_FOLDER = os.path.dirname(os.path.realpath(__file__))
TEST_LAMBDA_PYTHON = os.path.join(THIS_FOLDER, "functions/lambda_integration.py")
