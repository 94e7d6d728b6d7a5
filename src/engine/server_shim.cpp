// pipeshard's C entry to llama.cpp's server (tools/server, library
// llama-server-impl). Upstream declares llama_server() without C linkage
// and in no header (its main.cpp declares it the same way), so Rust reaches
// it through this one function.

int llama_server(int argc, char ** argv);

extern "C" int pipeshard_llama_server(int argc, char ** argv) {
    return llama_server(argc, argv);
}
