// OpenAI chat messages -> the chat template's input, so that assistant turns with
// reasoning_content and tool_calls, and tool results, round-trip into the prompt:
//   * content parts are joined into one string (text only), or kept as a list of
//     {"type":"text","text"} / {"type":"image"} parts when there is an image;
//   * assistant "reasoning_content" (or "reasoning") is kept as "reasoning_content";
//   * tool_calls keep id/type/name and get their JSON "arguments" string parsed into an object,
//     which is what templates iterate over (M3 renders each argument as a tag);
//   * tool messages keep tool_call_id and name; roles are checked.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "server/protocol/requests.h"

namespace m3::server {

Parsed<nlohmann::ordered_json> convert_messages(const nlohmann::ordered_json& messages,
                                        std::vector<ImageRef>& images);

}  // namespace m3::server
