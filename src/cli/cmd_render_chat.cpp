// `m3serve render-chat --model-path DIR --request FILE`: renders a chat request body with the
// model's chat template exactly as transformers' apply_chat_template would, and prints the prompt
// with no newline added. Exit code 1 on a template or request error (message on stderr).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "cli/commands.h"

namespace m3::cli {

int cmd_render_chat(const std::vector<std::string>& args) {
  std::string model_path, request_path;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: m3serve render-chat --model-path DIR --request FILE\n\n"
          "Renders the chat request in FILE (messages, tools, chat_template_kwargs,\n"
          "add_generation_prompt [default true], continue_final_message, documents) with the\n"
          "chat template of DIR (chat_template.jinja, else tokenizer_config.json) and prints\n"
          "the prompt exactly, with no newline added. FILE '-' reads standard input.\n");
      return 0;
    }
    if ((a == "--model-path" || a == "--request") && i + 1 < args.size()) {
      (a == "--model-path" ? model_path : request_path) = args[++i];
    } else {
      std::fprintf(stderr, "m3serve render-chat: unknown or incomplete option '%s'\n", a.c_str());
      return 2;
    }
  }
  if (model_path.empty() || request_path.empty()) {
    std::fprintf(stderr, "m3serve render-chat: --model-path and --request are required\n");
    return 2;
  }
  std::stringstream ss;
  if (request_path == "-") {
    ss << std::cin.rdbuf();
  } else {
    std::ifstream f(request_path, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "m3serve render-chat: cannot open %s\n", request_path.c_str());
      return 1;
    }
    ss << f.rdbuf();
  }
  nlohmann::ordered_json request = nlohmann::ordered_json::parse(ss.str(), nullptr, false);
  if (request.is_discarded()) {
    std::fprintf(stderr, "m3serve render-chat: %s is not valid JSON\n", request_path.c_str());
    return 1;
  }
  Result<ChatTemplate> tmpl = load_chat_template(model_path);
  if (!tmpl) {
    std::fprintf(stderr, "m3serve render-chat: %s\n", tmpl.status().to_string().c_str());
    return 1;
  }
  Result<std::string> prompt = render_chat(*tmpl, request);
  if (!prompt) {
    std::fprintf(stderr, "m3serve render-chat: %s\n", prompt.status().to_string().c_str());
    return 1;
  }
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace m3::cli
