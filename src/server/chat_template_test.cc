// Chat templates: the family is recognized from the real templates in tests/data/templates
// and renders exactly what the Jinja renders (expected strings worked out by hand from
// the .jinja files, HF semantics: trim_blocks + lstrip_blocks).
#include "server/chat_template.h"

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace trellis::server {
namespace {

std::string ReadTemplate(const std::string& name) {
  std::ifstream f(std::string(TRELLIS_TEST_DATA) + "/templates/" + name);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi there"},
    {"assistant", "Hello."},
    {"user", "What is 2+2?"},
};

ChatTemplate Detect(const std::string& file, TemplateTokens t = {}) {
  auto r = ChatTemplate::Detect(ReadTemplate(file), std::move(t));
  EXPECT_TRUE(r.ok()) << file << ": " << r.status().ToString();
  return std::move(r).value();
}

TEST(ChatTemplate, TinyLlamaIsZephyr) {
  ChatTemplate t = Detect("TinyLlama-1.1B-Chat-v1.0.jinja");
  EXPECT_EQ(t.name(), "zephyr");
  auto s = t.Render(kConversation, true);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s,
            "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n<|assistant|>\nHello.</s>\n"
            "<|user|>\nWhat is 2+2?</s>\n<|assistant|>\n");
  auto no_gen = t.Render(std::span(kConversation).first(2), false);
  EXPECT_EQ(*no_gen, "<|system|>\nYou are terse.</s>\n<|user|>\nHi there</s>\n");
}

TEST(ChatTemplate, Llama31) {
  ChatTemplate t = Detect("meta-llama-Llama-3.1-8B-Instruct.jinja", {"<|begin_of_text|>", "<|eot_id|>"});
  EXPECT_EQ(t.name(), "llama3.1");
  std::vector<ChatMessage> msgs = kConversation;
  msgs[0].content = "  You are terse.\n";  // |trim
  auto s = t.Render(msgs, true);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
            "You are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // No system message: the system header is still there, empty.
  auto u = t.Render(std::span(kConversation).subspan(1, 1), false);
  EXPECT_EQ(*u,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
            "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>");
}

TEST(ChatTemplate, Llama3) {
  // Meta-Llama-3-8B-Instruct's template.
  const std::string jinja =
      "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
      "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
      "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
      "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
  auto t = ChatTemplate::Detect(jinja, {"<|begin_of_text|>", "<|eot_id|>"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name(), "llama3");
  auto s = t->Render(std::span(kConversation).first(2), true);
  EXPECT_EQ(*s,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, QwenChatMlWithDefaultSystem) {
  ChatTemplate t = Detect("Qwen-Qwen2.5-7B-Instruct.jinja", {"", "<|im_end|>"});
  EXPECT_EQ(t.name(), "chatml");
  auto s = t.Render(kConversation, true);
  EXPECT_EQ(*s,
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto d = t.Render(std::span(kConversation).subspan(1, 1), true);
  EXPECT_EQ(*d,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
  // Plain ChatML by name has no default system prompt.
  auto plain = ChatTemplate::FromName("chatml", {});
  EXPECT_EQ(*plain->Render(std::span(kConversation).subspan(1, 1), false), "<|im_start|>user\nHi there<|im_end|>\n");
}

TEST(ChatTemplate, Llama2) {
  const std::string jinja =
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
      "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
      "{% endif %}{% for message in loop_messages %}{% if loop.index0 == 0 and system_message != false %}"
      "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
      "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + "
      "'[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + "
      "content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
  auto t = ChatTemplate::Detect(jinja, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name(), "llama2");
  auto s = t->Render(kConversation, true);
  EXPECT_EQ(*s,
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi there [/INST] Hello. </s>"
            "<s>[INST] What is 2+2? [/INST]");
}

TEST(ChatTemplate, Mistral) {
  const std::string jinja =
      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
      "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only "
      "user and assistant roles are supported!') }}{% endif %}{% endfor %}";
  auto t = ChatTemplate::Detect(jinja, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->name(), "mistral");
  auto s = t->Render(std::span(kConversation).subspan(1), true);
  EXPECT_EQ(*s, "<s>[INST] Hi there [/INST]Hello.</s>[INST] What is 2+2? [/INST]");
  // A system message is folded into the first user turn (llama.cpp does the same).
  EXPECT_EQ(*t->Render(kConversation, true),
            "<s>[INST] You are terse.\n\nHi there [/INST]Hello.</s>[INST] What is 2+2? [/INST]");
  std::vector<ChatMessage> bad = {{"user", "a"}, {"user", "b"}};
  EXPECT_FALSE(t->Render(bad, true).ok());
}

TEST(ChatTemplate, MistralNemo) {
  ChatTemplate t = Detect("mistralai-Mistral-Nemo-Instruct-2407.jinja");
  EXPECT_EQ(t.name(), "mistral-nemo");
  EXPECT_EQ(*t.Render(kConversation, true),
            "<s>[INST]Hi there[/INST]Hello.</s>[INST]You are terse.\n\nWhat is 2+2?[/INST]");
}

TEST(ChatTemplate, Phi3) {
  ChatTemplate t = Detect("microsoft-Phi-3.5-mini-instruct.jinja", {"<s>", "<|endoftext|>"});
  EXPECT_EQ(t.name(), "phi3");
  EXPECT_EQ(*t.Render(std::span(kConversation).first(2), true),
            "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\n");
  EXPECT_EQ(*t.Render(std::span(kConversation).subspan(1, 1), false), "<|user|>\nHi there<|end|>\n<|endoftext|>");
}

TEST(ChatTemplate, UnknownTemplatesAreErrors) {
  for (const char* f : {"google-gemma-2-2b-it.jinja", "HuggingFaceTB-SmolLM3-3B.jinja"}) {
    auto r = ChatTemplate::Detect(ReadTemplate(f), {});
    ASSERT_FALSE(r.ok()) << f << " was taken for " << r->name();
    EXPECT_NE(r.status().message().find("--chat-template"), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(ChatTemplate::Detect("{{ messages }}", {}).ok());
  auto n = ChatTemplate::FromName("vicuna", {});
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("zephyr"), std::string::npos);
}

TEST(ChatTemplate, EveryNameRoundTrips) {
  for (const char* n : {"llama2", "llama3", "llama3.1", "mistral", "mistral-nemo", "chatml", "zephyr", "phi3"}) {
    auto t = ChatTemplate::FromName(n, {});
    ASSERT_TRUE(t.ok()) << n;
    EXPECT_EQ(t->name(), n);
    std::vector<ChatMessage> one = {{"user", "x"}};
    EXPECT_TRUE(t->Render(one, true).ok()) << n;
    std::vector<ChatMessage> tool = {{"tool", "x"}};
    EXPECT_FALSE(t->Render(tool, true).ok()) << n;
  }
}

}  // namespace
}  // namespace trellis::server
