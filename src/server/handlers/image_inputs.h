// The images of a chat request, from their URLs to BackendImages placed in the prompt:
//  1. each URL passes the media policy (media_policy.h); a remote http(s) URL is then fetched
//     (remote_fetch.h: it blocks up to --media-fetch-timeout, so this runs on the server's worker
//     threads, never its I/O threads; several remote images are fetched one after another);
//  2. each image (a data: URI's or a fetched body's bytes) is decoded (image_decode.h) and
//     pre-processed (image_preprocess.h);
//  3. each image placeholder the chat template wrote is expanded to
//     ]<]start of image[>[ + N x ]<]image[>[ + ]<]end of image[>[ (N = patches / merge^2);
//  4. after tokenization, the runs of image tokens are matched to the images in order, and any
//     mismatch (say, a literal placeholder typed in the text) is a 400.
// Every failure is the 400 to send; none throws.
#pragma once

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "server/backend.h"
#include "server/media/image_preprocess.h"
#include "server/media/media_policy.h"
#include "server/protocol/requests.h"

namespace m3::server {

inline constexpr std::string_view kImageToken = "]<]image[>[";
inline constexpr std::string_view kImageStartToken = "]<]start of image[>[";
inline constexpr std::string_view kImageEndToken = "]<]end of image[>[";

// Steps 1-2 for every image of the request, in order (token offsets are filled by step 4).
std::variant<std::vector<std::shared_ptr<BackendImage>>, ApiError> prepare_images(
    const std::vector<ImageRef>& refs, const MediaOptions& media,
    const VisionPreprocessConfig& vision, const PreprocessOverrides& overrides,
    const Resolver& resolve = system_resolve);

// Step 3: the prompt with each placeholder expanded for its image, or a 400 when the prompt has
// another number of placeholders than there are images.
std::variant<std::string, ApiError> expand_image_placeholders(
    const std::string& prompt, const std::vector<std::shared_ptr<BackendImage>>& images,
    const std::string& param);

// Step 4: sets each image's token_offset from the runs of `image_token_id` in `tokens`.
std::optional<ApiError> place_image_tokens(const std::vector<int32_t>& tokens,
                                           int32_t image_token_id,
                                           const std::vector<std::shared_ptr<BackendImage>>& images,
                                           const std::string& param);

}  // namespace m3::server
