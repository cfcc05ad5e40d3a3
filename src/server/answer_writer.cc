#include "server/answer_writer.h"

namespace trellis::server {

http::HttpResponse OpenAiErrorResponse(const ApiError& e) {
  http::HttpResponse r;
  r.status = e.status;
  r.body = ErrorJson(e);
  if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

OpenAiWriter::OpenAiWriter(Endpoint ep, std::string id, int64_t created, std::string model, const GenerationParams& gen,
                           std::string echo)
    : ep_(ep),
      id_(std::move(id)),
      model_(std::move(model)),
      echo_(std::move(echo)),
      created_(created),
      logprobs_(gen.logprobs),
      include_usage_(gen.include_usage),
      text_offset_(echo_.size()) {}

http::HttpResponse OpenAiWriter::Whole(const WholeAnswer& a) {
  CompletionResponse out;
  out.endpoint = ep_;
  out.id = id_;
  out.created = created_;
  out.model = model_;
  out.text = echo_ + a.text;
  out.text_offset_base = echo_.size();
  out.reasoning = a.reasoning;
  out.tool_calls = a.tool_calls;
  out.finish_reason = a.end.finish_reason;
  out.usage = a.end.usage;
  out.with_logprobs = logprobs_;
  out.logprobs = a.logprobs;
  http::HttpResponse r;
  r.body = ResponseJson(out);
  return r;
}

StreamChunk OpenAiWriter::Chunk() const {
  StreamChunk c;
  c.endpoint = ep_;
  c.id = id_;
  c.created = created_;
  c.model = model_;
  c.with_logprobs = logprobs_;
  c.usage_null = include_usage_;
  return c;
}

std::string OpenAiWriter::Open() {
  StreamChunk c = Chunk();
  if (ep_ == Endpoint::kChat) {
    c.role = true;
    return Event(ChunkJson(c));
  }
  if (echo_.empty()) return {};
  c.text = echo_;
  return Event(ChunkJson(c));
}

std::string OpenAiWriter::Delta(AnswerDelta& d) {
  if (d.empty()) return {};
  StreamChunk c = Chunk();
  c.text = std::move(d.content);
  c.reasoning = std::move(d.reasoning);
  c.tool_calls = std::move(d.calls);
  c.logprobs = std::move(d.logprobs);
  c.text_offset_base = text_offset_;
  text_offset_ = NextTextOffset(c);
  return Event(ChunkJson(c));
}

std::string OpenAiWriter::Close(const AnswerEnd& e) {
  StreamChunk c = Chunk();
  c.finish_reason = e.finish_reason;
  std::string out = Event(ChunkJson(c));
  if (include_usage_) out += Event(UsageChunkJson(ep_, id_, created_, model_, e.usage));
  return out + "data: [DONE]\n\n";
}

std::string OpenAiWriter::Failed(const ApiError& e) { return Event(ErrorJson(e)) + "data: [DONE]\n\n"; }

}  // namespace trellis::server
