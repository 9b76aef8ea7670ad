// The Vercel AI SDK (`ai` + `@ai-sdk/openai`, pinned in tests/clients/package.json) against `ahc serve`, as
// its users write it: the provider's default `openai(model)` (the Responses API, `store` on), history kept by
// appending each result's `response.messages`, which the provider then sends back as `item_reference` items
// naming the earlier output items. Run by tests/test_ai_sdk.py:
//
//   AHC_BASE_URL=http://host:port AHC_API_KEY=... AHC_MODEL=... AHC_LOGIT_BIAS='{"id": -100}' \
//   AHC_CLIENTS=/path/.cache/clients/node_modules node tests/clients/ai_sdk_turns.mjs
//
// (a) three generateText turns, (b) a streamText turn continuing them, (c) a tool loop (a tool call forced on
// step 0, its result, a text answer on step 1). Each request goes through a `fetch` wrapper that adds the
// logit bias to its body (a small model's tool-call JSON stays short without whitespace-only tokens) and
// notes what was sent and answered. A JSON summary goes to stdout; the exit status is 0 when every turn ran.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

// The packages sit in the suite's npm folder (.cache/clients/node_modules), not beside this script, so a bare
// `import 'ai'` here cannot find them: each is imported by its ESM entry point ("exports" → "." → "import"),
// whose own imports then resolve inside that folder as they do in a user's project.
const NODE_MODULES = env('AHC_CLIENTS');

async function load(name) {
  const dir = join(NODE_MODULES, name);
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  let entry = manifest.exports?.['.'] ?? manifest.exports;
  entry = typeof entry === 'string' ? entry : entry?.import ?? manifest.module ?? manifest.main;
  if (typeof entry !== 'string') entry = entry.default;
  return import(pathToFileURL(join(dir, entry)).href);
}

const { generateText, streamText, tool, stepCountIs } = await load('ai');
const { createOpenAI } = await load('@ai-sdk/openai');
const { z } = await load('zod');

const LOGIT_BIAS = JSON.parse(process.env.AHC_LOGIT_BIAS || '{}');
const exchanges = []; // every request the provider made, in order

function cacheOf(usage, context) {
  return { usage: usage ?? null, cached_tokens: usage?.input_tokens_details?.cached_tokens ?? null,
           context: context ?? null };
}

// What a response says of its usage and AHC's cache report: the JSON body, or a stream's events
// (`context` in response.created's response, `usage` in response.completed's).
async function answered(response, streamed) {
  const text = await response.text();
  if (!streamed) {
    try {
      const body = JSON.parse(text);
      return { ...cacheOf(body.usage, body.context), error: response.ok ? null : body };
    } catch {
      return { ...cacheOf(null, null), error: text };
    }
  }
  let usage = null, context = null;
  for (const line of text.split('\n')) {
    if (!line.startsWith('data: ')) continue;
    const event = JSON.parse(line.slice(6));
    if (event.type === 'response.created') context = event.response?.context;
    if (event.type === 'response.completed') usage = event.response?.usage;
  }
  return cacheOf(usage, context);
}

async function noting(url, init = {}) {
  let body = init.body;
  let sent = null;
  if (typeof body === 'string') {
    sent = JSON.parse(body);
    if (Object.keys(LOGIT_BIAS).length) sent.logit_bias = LOGIT_BIAS;
    body = JSON.stringify(sent);
  }
  const response = await fetch(url, { ...init, body });
  const input = Array.isArray(sent?.input) ? sent.input : [];
  const exchange = {
    url: String(url), status: response.status, session: response.headers.get('x-session-id'),
    item_references: input.filter((item) => item.type === 'item_reference').map((item) => item.id),
    input_types: input.map((item) => item.type ?? `message:${item.role}`),
    tool_choice: sent?.tool_choice ?? null, stream: Boolean(sent?.stream), body: sent,
  };
  exchanges.push(exchange);
  exchange.answer = answered(response.clone(), exchange.stream); // read as the SDK reads the original
  return response;
}

const openai = createOpenAI({ baseURL: `${env('AHC_BASE_URL')}/v1`, apiKey: env('AHC_API_KEY'), fetch: noting });
const model = openai(env('AHC_MODEL')); // the default: the Responses API, store on

const SYSTEM = 'Answer in one short sentence.';
const QUESTIONS = ['What is the capital of France?', 'And the capital of Italy?', 'And the capital of Spain?'];
const STREAMED = 'Which of these three cities is the largest?';
const ASK_WEATHER = 'What is the weather like in Paris today?';
const turns = [];

function turn(kind, question, from, result, extra = {}) {
  turns.push({ kind, question, text: result.text, response_id: result.response.id,
               usage: result.usage, requests: exchanges.slice(from), ...extra });
}

// (a) Three generateText turns, each continuing the history the last one returned.
const messages = [];
for (const question of QUESTIONS) {
  const from = exchanges.length;
  messages.push({ role: 'user', content: question });
  const result = await generateText({ model, system: SYSTEM, messages, maxOutputTokens: 24, temperature: 0 });
  messages.push(...result.response.messages);
  turn('generateText', question, from, result);
}

// (b) A streamed turn continuing them.
{
  const from = exchanges.length;
  messages.push({ role: 'user', content: STREAMED });
  const result = streamText({ model, system: SYSTEM, messages, maxOutputTokens: 24, temperature: 0 });
  const deltas = [];
  for await (const delta of result.textStream) deltas.push(delta);
  const response = await result.response;
  messages.push(...response.messages);
  turns.push({ kind: 'streamText', question: STREAMED, text: await result.text, deltas: deltas.length,
               response_id: response.id, usage: await result.usage, requests: exchanges.slice(from) });
}

// (c) A tool loop, a conversation of its own: the call forced on step 0, a text answer on step 1.
{
  const executed = [];
  const getWeather = tool({
    description: 'Get the current weather in a city.',
    inputSchema: z.object({ city: z.string().describe('The city') }),
    execute: async ({ city }) => {
      executed.push({ city });
      return `It is sunny and 21 C in ${city}.`;
    },
  });
  const from = exchanges.length;
  const result = await generateText({
    model, system: 'Use the get_weather tool, then answer in one sentence.', prompt: ASK_WEATHER,
    tools: { get_weather: getWeather }, maxOutputTokens: 48, temperature: 0,
    prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
    stopWhen: stepCountIs(2),
  });
  turn('toolLoop', ASK_WEATHER, from, result, {
    executed,
    steps: result.steps.map((step) => ({
      finish_reason: step.finishReason, text: step.text,
      tool_calls: step.toolCalls.map((call) => ({ id: call.toolCallId, name: call.toolName, input: call.input })),
      tool_results: step.toolResults.map((r) => ({ id: r.toolCallId, name: r.toolName, output: r.output })),
      response_id: step.response.id,
    })),
  });
}

for (const exchange of exchanges) exchange.answer = await exchange.answer;
process.stdout.write(JSON.stringify({ turns }, null, 2) + '\n');
