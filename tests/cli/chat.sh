#!/usr/bin/env bash
# cli_chat: `trellis chat` in a real terminal (tmux: send-keys, capture-pane): streaming,
# the per-turn line with the tokens reused from earlier turns, line editing and history,
# /stats, /reset, /system, Ctrl-C at the prompt, Ctrl-D to leave; then, piped, on a
# random model of every architecture with its family's chat template.
# usage: chat.sh TRELLIS DATA_DIR
set -euo pipefail
TRELLIS=$1 DATA=$2
source "$(dirname "$0")/lib.sh"
command -v tmux >/dev/null || die "tmux is not installed (scripts/setup.sh installs it)"

model=$tmp/tiny.gguf
"$TRELLIS" gen-model --shape tiny --type q4_0 -o "$model" 2>/dev/null
sess=trellis-chat-$$
sock=$tmp/tmux.sock
tm() { tmux -S "$sock" "$@"; }
trap 'tm kill-server 2>/dev/null || true; rm -rf "$tmp"' EXIT
screen() { tm capture-pane -p -t "$sess" -S -200; }
# wait_for REGEX [N]: until the screen shows REGEX at least N times (default 1), 20 s at most.
wait_for() {
  local re=$1 n=${2:-1}
  for _ in $(seq 200); do
    [[ $(screen | grep -cE -- "$re" || true) -ge $n ]] && return 0
    sleep 0.1
  done
  die "screen never showed /$re/ x$n: $(screen)"
}

say "the chat starts in a terminal and names the template"
tm new-session -d -s "$sess" -x 220 -y 60 "$TRELLIS chat -m $model -n 6 --temp 0"
wait_for "^trellis chat: tiny.gguf \(llama, .*template zephyr"
wait_for "^>"
ok "$(screen | head -1 | cut -c1-150)"

say "a turn streams a reply, then its line: prompt, reused, computed, TTFT"
tm send-keys -t "$sess" "Hello there" Enter
wait_for "^\[prompt [0-9]+ tokens, 0 reused from earlier turns"
ok "$(screen | grep -E '^\[prompt' | tail -1)"

say "line editing: Left, insert, Home; the second turn reuses the first from the cache"
tm send-keys -t "$sess" "abd" Left "c" Home "x" End "e" Enter
wait_for "^> xabcde$"
wait_for "^\[prompt [0-9]+ tokens" 2
second=$(screen | grep -E '^\[prompt' | tail -1)
reused=$(sed -E 's/.*tokens, ([0-9]+) reused.*/\1/' <<<"$second")
[[ $reused -gt 0 ]] || die "second turn reused nothing: $second"
ok "$second"

say "Up recalls the previous line; Backspace edits it"
tm send-keys -t "$sess" Up BSpace BSpace "Z" Enter
wait_for "^> xabcZ$"
wait_for "^\[prompt [0-9]+ tokens" 3
ok "recalled and edited: $(screen | grep -E '^> xabcZ$' | tail -1)"

say "Ctrl-C at the prompt discards the line"
tm send-keys -t "$sess" "never sent" C-c
wait_for "never sent\^C"
tm send-keys -t "$sess" "/stats" Enter
wait_for "^\[3 turns \| prompt [0-9]+ tokens, [0-9]+ reused"
ok "$(screen | grep -E '^\[3 turns' | tail -1)"

say "/reset and /system"
tm send-keys -t "$sess" "/reset" Enter
wait_for "^\[conversation cleared\]"
tm send-keys -t "$sess" "/system You are terse." Enter
wait_for "^\[system prompt set\]"
tm send-keys -t "$sess" "Hi" Enter
wait_for "^\[prompt [0-9]+ tokens" 4
ok "$(screen | grep -E '^\[prompt' | tail -1)"

say "Ctrl-D on an empty line leaves"
tm send-keys -t "$sess" C-d
for _ in $(seq 100); do tm has-session -t "$sess" 2>/dev/null || break; sleep 0.1; done
! tm has-session -t "$sess" 2>/dev/null || die "still running after Ctrl-D: $(screen)"
ok "exited"

say "piped, on every architecture with its family's template"
T=$DATA/templates
# The mixtures of experts' reference models are generated (tests/data/README.md).
for arch in qwen3moe mixtral qwen2moe; do
  "$TRELLIS" gen-model --shape moe-tiny --arch $arch --type f16 --vocab "$DATA/reference/ref-a-f16.gguf" \
    -o "$tmp/ref-$arch-f16.gguf" 2>/dev/null || die "gen-model $arch"
done
for pair in "qwen2:Qwen-Qwen2.5-7B-Instruct" "qwen3:Qwen-Qwen2.5-7B-Instruct" "phi3:microsoft-Phi-3.5-mini-instruct" \
            "gemma2:google-gemma-2-2b-it" "gemma3:google-gemma-2-2b-it" "llama3.2:meta-llama-Llama-3.1-8B-Instruct" \
            "qwen3moe:Qwen-Qwen3" "mixtral:mistralai-Mistral-Nemo-Instruct-2407" "qwen2moe:Qwen-Qwen2.5-7B-Instruct"; do
  arch=${pair%%:*} tmpl=${pair#*:}
  m=$DATA/reference/ref-$arch-f16.gguf
  [[ -f $m ]] || m=$tmp/ref-$arch-f16.gguf
  out=$(printf 'What is 2+2?\nAnd 3+3?\n/stats\n' |
        timeout 60 "$TRELLIS" chat -m "$m" --chat-template "$T/$tmpl.jinja" -n 4 --temp 0 -t 1 2>&1) ||
    die "$arch: $out"
  [[ $(grep -c '^\[prompt' <<<"$out") -eq 2 ]] || die "$arch: $out"
  r2=$(grep '^\[prompt' <<<"$out" | tail -1 | sed -E 's/.*tokens, ([0-9]+) reused.*/\1/')
  [[ $r2 -gt 0 ]] || die "$arch: the second turn reused nothing: $out"
  grep -q "template jinja" <<<"$out" || die "$arch: not the Jinja template: $out"
  ok "$arch: $(grep '^\[prompt' <<<"$out" | tail -1)"
done

say "a thinking model's reasoning is shown apart from the answer and kept out of the history"
# A template that opens the reasoning block in the generation prompt (as the R1 distills'
# do): a random model never closes it, so its whole reply is reasoning, the answer is
# empty, and the next turn's prompt holds none of the reasoning text.
cat >"$tmp/think.jinja" <<'EOF'
{% for m in messages %}<|{{ m.role }}|>
{{ m.content }}</s>
{% endfor %}{% if add_generation_prompt %}<|assistant|>
<think>
{% endif %}{# the reasoning ends at </think> #}
EOF
out=$(printf 'Think about it\nAgain\n' |
      timeout 60 "$TRELLIS" chat -m "$model" --chat-template "$tmp/think.jinja" -n 6 --temp 0 -t 1 2>&1) || die "$out"
[[ $(grep -c '^\[thinking\]$' <<<"$out") -eq 2 ]] || die "no [thinking] block per turn: $out"
p2=$(grep '^\[prompt' <<<"$out" | tail -1 | sed -E 's/^\[prompt ([0-9]+) tokens.*/\1/')
# The same template without the marker does not think: its history keeps the reply, so
# its second prompt is longer by the reply's tokens.
sed 's/{# the reasoning ends at <\/think> #}//' "$tmp/think.jinja" >"$tmp/plain.jinja"
plain=$(printf 'Think about it\nAgain\n' |
        timeout 60 "$TRELLIS" chat -m "$model" --chat-template "$tmp/plain.jinja" -n 6 --temp 0 -t 1 2>&1) || die "$plain"
! grep -q '^\[thinking\]$' <<<"$plain" || die "a template without </think> showed reasoning: $plain"
q2=$(grep '^\[prompt' <<<"$plain" | tail -1 | sed -E 's/^\[prompt ([0-9]+) tokens.*/\1/')
[[ $q2 -gt $p2 ]] || die "the reasoning went into the history ($p2 tokens, $q2 with the reply kept): $out"
ok "reasoning apart; turn 2 prompt $p2 tokens ($q2 with the reply kept)"

echo "PASS cli_chat: $n_checks checks"
