// pipeshard's C entry to llama.cpp's server (tools/server, library
// llama-server-impl). Upstream declares llama_server() without C linkage
// and in no header (its main.cpp declares it the same way), so Rust reaches
// it through this one function.

int llama_server(int argc, char ** argv);

extern "C" int pipeshard_llama_server(int argc, char ** argv) {
    return llama_server(argc, argv);
}

// common's chat templates (the server's: Jinja, with upstream's fixes and
// fallbacks) applied to n (role, content) messages of `model`'s own template.
// Returns the prompt, or NULL with the reason in *error; both are freed with
// pipeshard_string_free().

#include "chat.h"

#include <cstdlib>
#include <cstring>
#include <exception>

extern "C" char * pipeshard_chat_apply(const struct llama_model * model, const char * const * roles,
                                       const char * const * contents, size_t n, bool add_generation_prompt,
                                       char ** error) {
    *error = nullptr;
    try {
        auto tmpls = common_chat_templates_init(model, "");
        common_chat_templates_inputs inputs;
        for (size_t i = 0; i < n; i++) {
            common_chat_msg msg;
            msg.role    = roles[i];
            msg.content = contents[i];
            inputs.messages.push_back(msg);
        }
        inputs.add_generation_prompt = add_generation_prompt;
        inputs.use_jinja             = true;
        return strdup(common_chat_templates_apply(tmpls.get(), inputs).prompt.c_str());
    } catch (const std::exception & e) {
        *error = strdup(e.what());
        return nullptr;
    }
}

extern "C" void pipeshard_string_free(char * s) {
    free(s);
}

// common's fit (upstream's --fit): choose n_gpu_layers and the tensor buffer
// overrides (MoE experts or FFN parts to system memory) for one model on the
// devices llama.cpp sees, so that its projected device memory leaves
// margins[i] bytes of device i free. mparams must hold llama's defaults for
// what the fit chooses; overrides needs llama_max_tensor_buft_overrides()
// entries and receives patterns that live as long as the process. Returns
// common_params_fit_status (0: fits).

#include "fit.h"

#include <vector>

extern "C" int pipeshard_fit_params(const char * path_model, struct llama_model_params * mparams,
                                    struct llama_context_params * cparams, size_t * margins,
                                    struct llama_model_tensor_buft_override * overrides) {
    try {
        std::vector<float> tensor_split(llama_max_devices(), 0.0f);
        const int status = (int) common_fit_params(path_model, mparams, cparams, tensor_split.data(), overrides,
                                                   margins, cparams->n_ctx, nullptr, GGML_LOG_LEVEL_ERROR);
        mparams->tensor_split = nullptr; // one device: the split is all on it, and the buffer goes away here
        return status;
    } catch (const std::exception &) {
        return (int) COMMON_PARAMS_FIT_STATUS_ERROR;
    }
}
