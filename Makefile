# The two commands a newcomer needs: `make run` and `make test`. Both set everything up first.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
APT_PACKAGES := espeak-ng libespeak-ng1 chromium chromium-driver fonts-dejavu-core \
                festival festvox-us-slt-hts festvox-kallpc16k festvox-kdlpc16k alsa-utils \
                coturn iproute2

.PHONY: run test setup system lint bench

run: $(STAMP)
	$(VENV)/bin/synchrony serve

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q

setup: $(STAMP)

# System packages (espeak-ng and festival voices for generated test speech with exact word times,
# alsa-utils for its recorded test voice (bench/word_timing.py), Chromium for the browser test, coturn and
# iproute2 for the serving tests: a TURN server and a network namespace of their own, tests/test_deploy.py).
system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml | system
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	for b in bench/*.py; do $(PY) $$b || exit 1; done
