// The `full` memory-QA mode's prompt text: the whole conversation, then the question, as the user
// message (the system prompt is ANSWER_INSTRUCTION, as in every mode). The models in
// models/memory-qa-* were trained on exactly this form, so its output must not change.
//
// One line per turn, `${speaker}: ${text}`, sessions in order, no session date lines (the synthetic
// set asks no date questions, and one form for every data set keeps the comparison simple). A
// memory imported by src/memory/import.ts has the same `Speaker: text` form, so a turn reads the
// same in `full` as in `rag`'s retrieved memories.

export interface ConversationTurn {
  speaker: string;
  text: string;
}

/** The conversation as prompt text: one `speaker: text` line per turn, in order. */
export function renderConversation(turns: readonly ConversationTurn[]): string {
  return turns.map((t) => `${t.speaker}: ${t.text}`).join("\n");
}

/** The user message of the `full` mode: the conversation, a blank line, the question. */
export function fullContextQuery(conversationText: string, question: string): string {
  return `${conversationText}\n\n${question}`;
}
