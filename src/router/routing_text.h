// The text a request is routed by: what the worker's prefix cache will see first.
//   /v1/chat/completions: the message contents in order (system, user, assistant, tool; text
//     parts of content arrays; reasoning_content and tool call arguments of assistant turns),
//     each prefixed by its role and joined by '\n'. Not the chat template's rendering (the router
//     has no tokenizer), but it grows exactly as the rendered prompt does across turns, so a
//     conversation's next turn matches its previous turns.
//   /v1/completions: the prompt string, or token ids written as decimal text ("1 2 3 ").
//   anything else: the body as sent.
// A body that is not JSON routes by its raw bytes (the worker will refuse it anyway).
#pragma once

#include <string>
#include <string_view>

namespace m3::router {

std::string routing_text(std::string_view path, std::string_view body);

}  // namespace m3::router
