#!/usr/bin/env node
// Drives a running pdserve cluster through the real `openai` npm client (v4), the way an
// application would, and checks the shapes it gets back: plain chat, response_format
// json_schema, tools with tool_choice required / a named function, thinking
// (reasoning_content and usage.completion_tokens_details.reasoning_tokens), n > 1, each
// streamed and not, and a 400 for an unsupported schema keyword. The model is expected to be
// random (the tests' tiny model): the checks hold because the router constrains the output.
//
//   node tools/js/openai_e2e.js --base-url http://127.0.0.1:8000/v1 [--model pdserve]
//
// Exit status 0 when every check passed; 1 with the failures on stderr otherwise.
// tests/api/openai_client_e2e_test.cc starts the cluster and runs this script.
'use strict';

const assert = require('node:assert/strict');
const OpenAI = require('openai');

function parseArgs(argv) {
  const out = { baseUrl: 'http://127.0.0.1:8000/v1', model: 'pdserve' };
  for (let i = 2; i < argv.length; i += 2) {
    if (argv[i] === '--base-url') out.baseUrl = argv[i + 1];
    else if (argv[i] === '--model') out.model = argv[i + 1];
    else throw new Error(`unknown argument ${argv[i]}`);
  }
  return out;
}

const args = parseArgs(process.argv);
const client = new OpenAI({ baseURL: args.baseUrl, apiKey: 'unused', maxRetries: 0, timeout: 300000 });
const MODEL = args.model;
const failures = [];
let passed = 0;

async function check(name, fn) {
  try {
    await fn();
    ++passed;
    console.log(`ok   ${name}`);
  } catch (e) {
    failures.push(`${name}: ${e && e.stack ? e.stack : e}`);
    console.log(`FAIL ${name}`);
  }
}

const user = (text) => [{ role: 'user', content: text }];

// A weather report: every field bounded, so a random model finishes it.
const weatherSchema = {
  type: 'object',
  properties: {
    city: { enum: ['Paris', 'Lima', 'Oslo'] },
    celsius: { type: 'integer', minimum: -50, maximum: 50 },
    tags: { type: 'array', maxItems: 3, items: { type: 'string', pattern: '^[a-z]{1,6}$' } },
  },
  required: ['city', 'celsius'],
  additionalProperties: false,
};

function checkWeather(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v).filter((k) => !['city', 'celsius', 'tags'].includes(k)), []);
  assert.ok(['Paris', 'Lima', 'Oslo'].includes(v.city), `city ${v.city}`);
  assert.ok(Number.isInteger(v.celsius) && v.celsius >= -50 && v.celsius <= 50, `celsius ${v.celsius}`);
  if ('tags' in v) {
    assert.ok(Array.isArray(v.tags) && v.tags.length <= 3);
    for (const t of v.tags) assert.match(t, /^[a-z]{1,6}$/);
  }
  // Properties come in the schema's order.
  assert.deepEqual(Object.keys(v), ['city', 'celsius', 'tags'].filter((k) => k in v));
}

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The weather in a city',
      parameters: {
        type: 'object',
        properties: { city: { enum: ['Paris', 'Lima'] }, unit: { enum: ['c', 'f'] } },
        required: ['city'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'add',
      description: 'Adds two small numbers',
      parameters: {
        type: 'object',
        properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { type: 'integer', minimum: 0, maximum: 9 } },
        required: ['a', 'b'],
        additionalProperties: false,
      },
    },
  },
];

function checkCall(call, only) {
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  const names = tools.map((t) => t.function.name);
  assert.ok(names.includes(call.function.name), `called ${call.function.name}`);
  if (only) assert.equal(call.function.name, only);
  const a = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    assert.ok(['Paris', 'Lima'].includes(a.city));
    if ('unit' in a) assert.ok(['c', 'f'].includes(a.unit));
  } else {
    assert.ok(Number.isInteger(a.a) && a.a >= 0 && a.a <= 9 && Number.isInteger(a.b) && a.b >= 0 && a.b <= 9);
  }
}

// Token ids of "</think>" (from the server's own /tokenize), biased up with a frequency
// penalty: a random model then ends its reasoning after a few dozen tokens.
async function endReasoningSoon() {
  const r = await fetch(`${args.baseUrl}/tokenize`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: '</think>', add_special_tokens: false }),
  });
  assert.equal(r.status, 200);
  const { tokens } = await r.json();
  const logit_bias = {};
  for (const id of tokens) logit_bias[String(id)] = 100;
  return { logit_bias, frequency_penalty: 2 };
}

// Streams a chat completion with the raw chunk iterator and assembles it per choice.
async function streamChoices(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const choices = [];
  let usage = null;
  let roleChunks = 0;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const ch = (choices[c.index] ||= { content: '', reasoning: '', calls: [], finish: null });
      if (c.delta.role) ++roleChunks;
      if (c.delta.content) ch.content += c.delta.content;
      if (c.delta.reasoning_content) ch.reasoning += c.delta.reasoning_content;
      for (const t of c.delta.tool_calls || []) {
        const call = (ch.calls[t.index] ||= { id: '', type: '', function: { name: '', arguments: '' } });
        if (t.id) {
          assert.equal(call.id, '', 'a call has its id on its first delta only');
          call.id = t.id;
          call.type = t.type;
          call.function.name = t.function.name;
        }
        call.function.arguments += t.function.arguments || '';
      }
      if (c.finish_reason) ch.finish = c.finish_reason;
    }
  }
  assert.equal(roleChunks, choices.length, 'one role chunk per choice');
  return { choices, usage };
}

async function main() {
  await check('plain chat', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages: user('Hello'), max_tokens: 8 });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > 0 && r.usage.completion_tokens > 0);
  });

  const jsonSchema = { type: 'json_schema', json_schema: { name: 'weather', strict: true, schema: weatherSchema } };
  await check('json_schema', async () => {
    for (const temperature of [0, 1]) {
      const r = await client.chat.completions.create({
        model: MODEL, messages: user('The weather as JSON'), max_tokens: 400, temperature, seed: 7,
        response_format: jsonSchema,
      });
      assert.equal(r.choices[0].finish_reason, 'stop');
      checkWeather(r.choices[0].message.content);
    }
  });
  await check('json_schema streamed', async () => {
    const { choices } = await streamChoices({
      model: MODEL, messages: user('The weather as JSON'), max_tokens: 400, temperature: 1, seed: 8,
      response_format: jsonSchema,
    });
    assert.equal(choices[0].finish, 'stop');
    checkWeather(choices[0].content);
  });
  await check('json_object', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, messages: user('Any JSON object'), max_tokens: 1, response_format: { type: 'json_object' },
    });
    // Cut by max_tokens: a prefix, reported as length.
    assert.equal(r.choices[0].finish_reason, 'length');
  });

  await check('tool_choice required', async () => {
    const r = await client.chat.completions.create({
      // Seeded: unseeded sampling of the random test model may run a string argument past
      // max_tokens (finish_reason length), which this check is not about.
      model: MODEL, messages: user('Weather in Paris, and 2+3?'), max_tokens: 400, tools, tool_choice: 'required',
      seed: 11,
    });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.ok(m.tool_calls.length >= 1);
    for (const call of m.tool_calls) checkCall(call);
  });
  await check('tool_choice named, streamed (raw chunks and the client helper)', async () => {
    const params = {
      model: MODEL, messages: user('Add 2 and 3'), max_tokens: 400, tools,
      tool_choice: { type: 'function', function: { name: 'add' } }, temperature: 1, seed: 3,
    };
    const { choices } = await streamChoices(params);
    assert.equal(choices[0].finish, 'tool_calls');
    assert.equal(choices[0].calls.length, 1);
    checkCall(choices[0].calls[0], 'add');
    // The client's own stream assembler builds the same message from the deltas.
    const runner = client.beta.chat.completions.stream(params);
    const final = await runner.finalChatCompletion();
    const m = final.choices[0].message;
    assert.equal(final.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.tool_calls.length, 1);
    checkCall(m.tool_calls[0], 'add');
    assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), JSON.parse(choices[0].calls[0].function.arguments));
  });
  await check('tool result in the next turn', async () => {
    const r = await client.chat.completions.create({
      model: MODEL, max_tokens: 8, tools,
      messages: [
        ...user('Weather in Paris?'),
        { role: 'assistant', content: null,
          tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
        { role: 'tool', tool_call_id: 'call_1', content: '18 C' },
      ],
    });
    assert.equal(r.choices.length, 1);
  });

  await check('thinking', async () => {
    // A random model never closes its reasoning on its own: all of it is reasoning_content.
    const open = await client.chat.completions.create({
      model: MODEL, messages: user('Think'), max_tokens: 8, ignore_eos: true, chat_template_kwargs: { thinking: true },
    });
    assert.ok(open.choices[0].message.reasoning_content.length > 0, 'reasoning_content');
    assert.equal(open.choices[0].message.content, '');
    assert.equal(open.choices[0].finish_reason, 'length');
    assert.equal(open.usage.completion_tokens_details.reasoning_tokens, 8);
    // Biased towards "</think>": the reasoning ends, the answer follows.
    const bias = await endReasoningSoon();
    const params = {
      model: MODEL, messages: user('Think, then answer'), max_tokens: 200, temperature: 1, seed: 3,
      chat_template_kwargs: { thinking: true }, ...bias,
    };
    const r = await client.chat.completions.create(params);
    const m = r.choices[0].message;
    assert.ok(!(m.reasoning_content || '').includes('</think>'));
    assert.ok(m.content.length > 0, 'content after the reasoning');
    assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
    assert.ok(r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens);
    const s = await streamChoices(params);
    assert.equal(s.choices[0].reasoning, m.reasoning_content || '');
    assert.equal(s.choices[0].content, m.content);
    assert.equal(s.usage.completion_tokens_details.reasoning_tokens, r.usage.completion_tokens_details.reasoning_tokens);
  });
  await check('thinking with tools required', async () => {
    const bias = await endReasoningSoon();
    // A random model may not close its reasoning within max_tokens (then it reports length and
    // has no calls): a few seeds, until one does.
    let r = null;
    for (let seed = 5; seed < 11; ++seed) {
      r = await client.chat.completions.create({
        model: MODEL, messages: user('Weather in Lima?'), max_tokens: 400, temperature: 1, seed, tools,
        tool_choice: 'required', chat_template_kwargs: { thinking: true }, ...bias,
      });
      if (r.choices[0].finish_reason !== 'length') break;
      assert.equal(r.choices[0].message.tool_calls, undefined);
    }
    assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 0);
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    for (const call of r.choices[0].message.tool_calls) checkCall(call);
  });

  await check('n = 3 with a seed', async () => {
    const params = { model: MODEL, messages: user('Three answers'), max_tokens: 6, n: 3, seed: 11, temperature: 1 };
    const r = await client.chat.completions.create(params);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    const again = await client.chat.completions.create(params);
    assert.deepEqual(again.choices.map((c) => c.message.content), r.choices.map((c) => c.message.content));
    const s = await streamChoices(params);
    assert.deepEqual(s.choices.map((c) => c.content), r.choices.map((c) => c.message.content));
    assert.equal(s.usage.completion_tokens, r.usage.completion_tokens);
    const constrained = await client.chat.completions.create({ ...params, max_tokens: 400, response_format: jsonSchema });
    assert.equal(constrained.choices.length, 3);
    for (const c of constrained.choices) checkWeather(c.message.content);
  });

  await check('unsupported schema keyword is a 400 naming it', async () => {
    await assert.rejects(
      client.chat.completions.create({
        model: MODEL, messages: user('x'), max_tokens: 4,
        response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', minProperties: 1 } } },
      }),
      (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `got ${e}`);
        assert.equal(e.status, 400);
        assert.equal(e.param, 'response_format');
        assert.match(e.message, /minProperties/);
        return true;
      });
  });

  await check('legacy completions with a regex', async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: 'Code: ', max_tokens: 20, response_format: { type: 'regex', regex: '[A-Z]{3}-[0-9]{2}' },
    });
    assert.match(r.choices[0].text, /^[A-Z]{3}-[0-9]{2}$/);
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  console.log(`${passed} passed, ${failures.length} failed`);
  if (failures.length) {
    for (const f of failures) console.error(f);
    process.exit(1);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
