"""pytest plugin: run llama.cpp's own server tests (tools/server/tests/unit)
against pipeshard-server with local models instead of upstream's
Hugging Face ones. Loaded by scripts/server-tests.sh with
`-p pipeshard_models`; upstream's files are not changed.

Models come from environment variables the script sets:
  PIPESHARD_TEST_TEXT_MODEL    SmolLM2-135M-Instruct (pipeshard's default model)
  PIPESHARD_TEST_MOE_MODEL     `pipeshard synth --arch tiny-qwen3-30b-a3b`
  PIPESHARD_TEST_VL_MODEL      `pipeshard synth --arch tiny-qwen2.5-vl-7b`
  PIPESHARD_TEST_VL_MMPROJ     its vision projector
Every preset that names a text model (stories260K, bge-small, jina
reranker, tinylaya, tinyopenjev) gets the text model, so the tests that
need the very model they name fail; scripts/server-tests.sh lists why.
"""

import os

import utils
from utils import ServerPreset, ServerProcess

TEXT = "PIPESHARD_TEST_TEXT_MODEL"
PRESET_MODELS = {
    "tinyllama2": TEXT,
    "bert_bge_small": TEXT,
    "bert_bge_small_with_fa": TEXT,
    "tinyllama_infill": TEXT,
    "jina_reranker_tiny": TEXT,
    "tinylaya": TEXT,
    "tinyopenjev": TEXT,
    "stories15m_moe": "PIPESHARD_TEST_MOE_MODEL",
    "tinygemma3": "PIPESHARD_TEST_VL_MODEL",
}
MMPROJ = {"tinygemma3": "PIPESHARD_TEST_VL_MMPROJ"}
# Files upstream's tests download by URL: stories15M drafts for the
# stories15M MoE (test_speculative); the synthetic MoE drafts for itself
# (a draft needs the target's vocabulary).
URL_FILES = {
    "https://huggingface.co/ggml-org/tiny-llamas/resolve/main/stories15M-q4_0.gguf": "PIPESHARD_TEST_MOE_MODEL",
}


def _local(name, make):
    def preset() -> ServerProcess:
        server = make()
        server.model_hf_repo = None
        server.model_hf_file = None
        server.model_url = None
        server.model_file = os.environ[PRESET_MODELS[name]]
        server.pipeshard_mmproj = os.environ.get(MMPROJ.get(name, ""), None)
        return server

    return staticmethod(preset)


for _name in PRESET_MODELS:
    setattr(ServerPreset, _name, _local(_name, getattr(ServerPreset, _name)))
# Nothing to download: every model is local.
ServerPreset.load_all = staticmethod(lambda: None)

_start = ServerProcess.start


def _start_with_mmproj(self, *args, **kwargs):
    # ServerProcess has no local --mmproj; upstream's LLAMA_ARG_MMPROJ carries it.
    mmproj = getattr(self, "pipeshard_mmproj", None)
    if mmproj:
        os.environ["LLAMA_ARG_MMPROJ"] = mmproj
    else:
        os.environ.pop("LLAMA_ARG_MMPROJ", None)
    try:
        return _start(self, *args, **kwargs)
    finally:
        os.environ.pop("LLAMA_ARG_MMPROJ", None)


ServerProcess.start = _start_with_mmproj

_download = utils.download_file


def _download_local(url, output_file_path=None):
    if url in URL_FILES:
        return os.environ[URL_FILES[url]]
    return _download(url, output_file_path)


utils.download_file = _download_local
