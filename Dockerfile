# omni-actors on a CUDA machine: `docker build -t omni-actors .`, then
#   docker run --gpus all -p 8000:8000 -v ~/.cache/huggingface:/root/.cache/huggingface omni-actors
# serves Qwen/Qwen3-Omni-30B-A3B-Instruct on the preset of the GPUs it sees (docs/gpus.md);
# arguments after the image name replace the model (a Hub id, or a directory mounted in).
# The thinker on vLLM: --build-arg EXTRAS=vllm. It installs with the Makefile's own
# command (`make install`), so the image and a checkout get the same builds.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG EXTRAS=tiny-omni
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv make ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

WORKDIR /opt/omni-actors
COPY . .
RUN make install INSTALL_PYTHON=/opt/venv/bin/python EXTRAS=${EXTRAS}

EXPOSE 8000
ENTRYPOINT ["omni-actors", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["Qwen/Qwen3-Omni-30B-A3B-Instruct"]
