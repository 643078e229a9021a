"""Root of the test session: pytest puts this directory on ``sys.path`` (rootdir conftest), so the tests import
``train`` (train.py) and ``lab`` from the checkout as ``python -m`` run from here would. Test setup is in
tests/conftest.py."""
