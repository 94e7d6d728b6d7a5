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
