#include "server/handlers/image_inputs.h"

#include <cctype>
#include <string>

#include "server/media/remote_fetch.h"

namespace m3::server {

namespace {

bool is_http_url(const std::string& url) {
  std::string head = url.substr(0, 8);
  for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return head.rfind("http://", 0) == 0 || head.rfind("https://", 0) == 0;
}

}  // namespace

std::variant<std::vector<std::shared_ptr<BackendImage>>, ApiError> prepare_images(
    const std::vector<ImageRef>& refs, const MediaOptions& media,
    const VisionPreprocessConfig& vision, const PreprocessOverrides& overrides,
    const Resolver& resolve) {
  std::vector<std::shared_ptr<BackendImage>> out;
  const ImageLimits limits{media.max_image_bytes, media.max_image_pixels};
  if (overrides.max_pixels && *overrides.max_pixels > media.max_image_pixels) {
    return bad_request("mm_processor_kwargs.max_pixels (" + std::to_string(*overrides.max_pixels) +
                           ") is above this server's image limit of " +
                           std::to_string(media.max_image_pixels) + " pixels (--max-image-pixels).",
                       "mm_processor_kwargs.max_pixels");
  }
  for (const ImageRef& ref : refs) {
    std::string bytes;
    if (is_http_url(ref.url)) {
      // The fetch runs the policy check on the URL and again at every redirect (and pins the
      // connection to the checked address); its bytes are decoded like a data: URI's.
      auto fetched = fetch_remote_image(ref.url, ref.param, media, resolve);
      if (auto* e = std::get_if<ApiError>(&fetched)) return *e;
      bytes = std::move(std::get<FetchedImage>(fetched).bytes);
    } else {
      auto checked = check_image_url(ref.url, ref.param, media, resolve);
      if (auto* e = std::get_if<ApiError>(&checked)) return *e;
      bytes = std::move(std::get<CheckedImage>(checked).data);
    }
    auto decoded = decode_image(bytes, limits, ref.param);
    if (auto* e = std::get_if<ApiError>(&decoded)) return *e;
    auto patches = preprocess_image(std::get<RgbImage>(decoded), vision, overrides, ref.param);
    if (auto* e = std::get_if<ApiError>(&patches)) return *e;
    PixelPatches& p = std::get<PixelPatches>(patches);
    auto img = std::make_shared<BackendImage>();
    img->num_tokens = p.num_tokens(vision.merge_size);
    img->grid_t = p.grid_t;
    img->grid_h = p.grid_h;
    img->grid_w = p.grid_w;
    img->patch_values = p.patch_values;
    img->pixel_values = std::move(p.values);
    img->content_hash = p.content_hash;
    out.push_back(std::move(img));
  }
  return out;
}

std::variant<std::string, ApiError> expand_image_placeholders(
    const std::string& prompt, const std::vector<std::shared_ptr<BackendImage>>& images,
    const std::string& param) {
  std::string out;
  size_t at = 0, used = 0;
  for (;;) {
    const size_t hit = prompt.find(kImageToken, at);
    if (hit == std::string::npos) break;
    if (used == images.size()) {
      return bad_request("The prompt has more image placeholders (" + std::string(kImageToken) +
                             ") than the request has images; the text must not contain the "
                             "placeholder itself.",
                         param, "image_placeholder_mismatch");
    }
    out.append(prompt, at, hit - at);
    // A template that writes the start/end markers itself keeps them; else they are added.
    const bool has_start = out.size() >= kImageStartToken.size() &&
                           std::string_view(out).substr(out.size() - kImageStartToken.size()) ==
                               kImageStartToken;
    if (!has_start) out += kImageStartToken;
    for (int32_t i = 0; i < images[used]->num_tokens; ++i) out += kImageToken;
    at = hit + kImageToken.size();
    const bool has_end = std::string_view(prompt).substr(at, kImageEndToken.size()) == kImageEndToken;
    if (!has_end) out += kImageEndToken;
    ++used;
  }
  out.append(prompt, at, std::string::npos);
  if (used != images.size()) {
    return bad_request("The chat template wrote " + std::to_string(used) +
                           " image placeholders for " + std::to_string(images.size()) + " images.",
                       param, "image_placeholder_mismatch");
  }
  return out;
}

std::optional<ApiError> place_image_tokens(const std::vector<int32_t>& tokens,
                                           int32_t image_token_id,
                                           const std::vector<std::shared_ptr<BackendImage>>& images,
                                           const std::string& param) {
  size_t next = 0;
  for (size_t i = 0; i < tokens.size();) {
    if (tokens[i] != image_token_id) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < tokens.size() && tokens[j] == image_token_id) ++j;
    if (next == images.size() || int64_t(j - i) != images[next]->num_tokens) {
      return bad_request("The tokenized prompt's image placeholders do not match the images (a "
                         "run of " + std::to_string(j - i) + " image tokens); the text must not "
                         "contain the placeholder itself.",
                         param, "image_placeholder_mismatch");
    }
    images[next++]->token_offset = int32_t(i);
    i = j;
  }
  if (next != images.size()) {
    return bad_request("The tokenized prompt holds " + std::to_string(next) + " of the " +
                           std::to_string(images.size()) + " images.",
                       param, "image_placeholder_mismatch");
  }
  return std::nullopt;
}

}  // namespace m3::server
