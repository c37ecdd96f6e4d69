// The chat page of `edgespec serve` (served by edgespec/web/__init__.py): one conversation with the server's own
// OpenAI-compatible API, streamed. Text the draft proposed and the target accepted is shown green, as the desktop
// app shows it. Plain JavaScript: no build step, nothing loaded from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const SETTINGS = ["temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "draft_max"];
const KEY = "edgespec-api-key"; // sessionStorage: the key lives as long as the tab
const keyRequired = document.querySelector('meta[name="edgespec-key-required"]').content === "true";
const history = []; // {role, content} of the turns so far, sent with each request
let controller = null; // the AbortController of the request in flight (null: idle)

function headers() {
  const key = sessionStorage.getItem(KEY);
  return key ? { "Content-Type": "application/json", Authorization: `Bearer ${key}` }
    : { "Content-Type": "application/json" };
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

async function errorMessage(response) {
  // the server answers errors in OpenAI's shape, {"error": {"message": ...}}; something in between may not
  try {
    return (await response.json()).error.message;
  } catch {
    return `${response.status} ${response.statusText}`;
  }
}

function refusedKey(message) {
  $("key-form").hidden = false;
  $("key").focus();
  return `The server refused the API key: ${message}`;
}

let checks = 0; // only the latest check of the key speaks: an earlier one may answer later

async function checkKey() {
  // /v1/models needs the key where /health does not: a cheap way to ask whether the server takes ours
  const check = ++checks;
  const key = sessionStorage.getItem(KEY);
  const r = await fetch("/v1/models", { headers: headers() });
  if (check !== checks) return false;
  if (r.status === 401) {
    const message = refusedKey(await errorMessage(r));
    showError(key ? message : ""); // no key yet: the form alone asks for one
    return false;
  }
  $("key-form").hidden = true;
  showError(r.ok ? "" : await errorMessage(r));
  return r.ok;
}

function unreachable(e) {
  showError(`the server does not answer: ${e.message}`);
  return false;
}

async function loadHealth() {
  try {
    const health = await (await fetch("/health")).json();
    $("model").textContent = `${health.model} · draft: ${health.draft}`;
  } catch (e) {
    $("model").textContent = `the server does not answer (${e.message})`;
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = `msg ${role}`;
  div.textContent = text;
  $("conversation").append(div);
  return div;
}

function appendPiece(div, text, fromDraft) {
  // consecutive pieces of one kind share a span: the page grows by runs, not by tokens
  const kind = fromDraft ? "draft" : "target";
  let run = div.lastElementChild;
  if (!run || run.className !== kind) {
    run = document.createElement("span");
    run.className = kind;
    div.append(run);
  }
  run.textContent += text;
  const conversation = $("conversation");
  conversation.scrollTop = conversation.scrollHeight;
}

function requestBody() {
  const body = { messages: history, stream: true };
  for (const name of SETTINGS) {
    const value = $(name).value.trim();
    if (value !== "") body[name] = Number(value); // empty: the server's default
  }
  return body;
}

function invalidSetting() {
  const bad = SETTINGS.map($).find((input) => !input.checkValidity());
  return bad ? `${bad.id}: ${bad.validationMessage}` : "";
}

// the live line counts the stream's content chunks: one per token whose text is complete
function liveStatus(live) {
  const share = live.tokens ? Math.round((100 * live.fromDraft) / live.tokens) : 0;
  const seconds = (performance.now() - live.first) / 1000;
  const rate = live.tokens > 1 ? ` · ${((live.tokens - 1) / seconds).toFixed(1)} tok/s` : "";
  return `${live.tokens} tokens · ${share}% from the draft${rate}`;
}

// the server's statistics of the whole generation (the last chunk's `edgespec`), as the desktop app shows them
function finalStatus(s) {
  return `accepted ${s.accepted}/${s.drafted} drafts (${Math.round(100 * s.acceptance_rate)}%) · ` +
    `${s.generated_tokens} tokens · ${s.tokens_per_second.toFixed(1)} tok/s · finish: ${s.finish_reason}`;
}

async function* events(response) {
  // server-sent events "data: JSON\n\n", ending with "data: [DONE]"
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer.slice(0, end).split("\n").filter((line) => line.startsWith("data: "))
        .map((line) => line.slice(6)).join("\n");
      buffer = buffer.slice(end + 2);
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("new").disabled = busy;
  $("stop").disabled = !busy;
}

async function send() {
  const text = $("prompt").value;
  if (controller || !text.trim()) return;
  const invalid = invalidSetting();
  showError(invalid);
  if (invalid) return;
  history.push({ role: "user", content: text });
  const question = addMessage("user", text);
  const answer = addMessage("assistant", "");
  answer.classList.add("streaming");
  $("prompt").value = "";
  $("status").textContent = "waiting for the first token …";
  controller = new AbortController();
  setBusy(true);
  const live = { tokens: 0, fromDraft: 0, first: 0 };
  let content = "";
  let stats = null;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
      body: JSON.stringify(requestBody()), signal: controller.signal });
    if (r.status === 401) throw new Error(refusedKey(await errorMessage(r)));
    if (!r.ok) throw new Error(await errorMessage(r));
    for await (const chunk of events(r)) {
      if (chunk.error) throw new Error(chunk.error.message); // a failure after the stream started
      const choice = chunk.choices?.[0] ?? {};
      const piece = choice.delta?.content;
      if (piece) {
        const fromDraft = chunk.edgespec?.from_draft === true;
        if (!live.tokens) live.first = performance.now();
        live.tokens += 1;
        live.fromDraft += fromDraft ? 1 : 0;
        content += piece;
        appendPiece(answer, piece, fromDraft);
        $("status").textContent = liveStatus(live);
      }
      if (choice.finish_reason) stats = chunk.edgespec;
    }
    history.push({ role: "assistant", content });
    $("status").textContent = stats ? finalStatus(stats) : liveStatus(live);
  } catch (e) {
    if (e.name === "AbortError" && content) { // Stop: what was answered stays in the conversation
      history.push({ role: "assistant", content });
      $("status").textContent = `${liveStatus(live)} · stopped`;
    } else { // not answered: the question stays on the page but is not sent again
      history.pop();
      question.classList.add("failed");
      answer.classList.add("failed");
      $("status").textContent = "";
      if (e.name !== "AbortError") showError(e.message);
    }
  } finally {
    answer.classList.remove("streaming");
    controller = null;
    setBusy(false);
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { // Shift+Enter: a new line
    e.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", () => controller?.abort());
$("new").addEventListener("click", () => {
  history.length = 0;
  $("conversation").replaceChildren();
  $("status").textContent = "";
  showError("");
  $("prompt").focus();
});
$("key-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  if (await checkKey().catch(unreachable)) {
    $("key").value = "";
    $("prompt").focus();
  }
});

loadHealth();
if (keyRequired) checkKey().catch(unreachable); // a key kept earlier in this tab is used if the server still takes it
$("prompt").focus();
