// Headers that bindgen turns into `pipeshard::engine::ffi`.
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"
#include "ggml-alloc.h"
#include "ggml-cpu.h"
#include "gguf.h"
#include "mtmd.h"
#include "mtmd-helper.h"
#include "load-hook.h"
#include "server-ext.h"

// src/engine/server_shim.cpp: upstream's llama_server(argc, argv), and
// common's chat templates.
int pipeshard_llama_server(int argc, char ** argv);
char * pipeshard_chat_apply(const struct llama_model * model, const char * const * roles,
                            const char * const * contents, size_t n, bool add_generation_prompt, char ** error);
void pipeshard_string_free(char * s);
int pipeshard_fit_params(const char * path_model, struct llama_model_params * mparams,
                         struct llama_context_params * cparams, size_t * margins,
                         struct llama_model_tensor_buft_override * overrides);
