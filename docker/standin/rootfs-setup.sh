#!/bin/bash
# Runs inside the stand-in's root file system (chroot), with the pinned wheels at /tmp/wheels: the user
# and the Python environment the real rayproject/ray image has (a non-root `ray` owning the Python on
# PATH), and a pip that installs offline (docker/Dockerfile's install step must find everything present).
set -euxo pipefail
useradd --uid 1000 --gid users --create-home --shell /bin/bash ray
python3 -m venv /home/ray/python
/home/ray/python/bin/pip install -q --no-index --no-deps --no-compile --find-links /tmp/wheels -r /tmp/wheels/pins.txt
/home/ray/python/bin/pip install -q --no-index --find-links /opt/wheelhouse --upgrade pip
/home/ray/python/bin/python -c "import ray, torch, torchvision, mlflow, psycopg2; print('stand-in: ray', ray.__version__, 'torch', torch.__version__)"
chown -R ray:users /home/ray
printf '[global]\nno-index = true\nfind-links = /opt/wheelhouse\ndisable-pip-version-check = true\n' > /etc/pip.conf
apt-get clean
rm -rf /var/lib/apt/lists/*
