"""The compose smoke run (`make compose-smoke`): docker-compose.yml started for real on podman.

Owns: the run (`lab.compose.smoke`), its pure plan (`lab.compose.plan`), the container engine
(`lab.compose.engine`), the images (`lab.compose.images`), the ordered start
(`lab.compose.up`), docs/deploy-compose.md's commands run as written (`lab.compose.doc`) and the
TLS probe run inside the compose network (`lab.compose.tlsprobe`).
Must never: leave a container, volume or image of its own behind, or edit the shipped files.
"""
